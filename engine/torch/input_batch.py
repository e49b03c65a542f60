"""The model runner's persistent batch: per-request state kept across iterations, and the packed
inputs of one iteration built from it incrementally.

Rebuilding every input from Python lists each step costs host time in proportion to running
requests x context (every block table copied every step). Here a request owns a *slot* while
it keeps being scheduled: its block table lives in a persistent array where only the blocks
added since its last step are written, and its sampling parameters are written once, when it
gets the slot. Each step makes one pass over the scheduled requests to read what changed (tokens
computed, the token to feed, new blocks); everything else is numpy over arrays, and the results
go into persistent (pinned, on CUDA) host buffers and from there into persistent device buffers,
which the CUDA graphs read, so a replay needs no extra copy.

Block tables only grow in place (the block managers append); every reset (a free on preemption
or finish, a prefix-cache admission) installs a new list object. So a slot remembers the list
it copied and how long it was: same list and longer means "copy the tail", another list means
"copy it all".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..core.request import Request

SLOT_GROWTH = 2  # the slot table doubles when a batch has more requests than slots


@dataclass(frozen=True)
class HostInputs:
    """One iteration's packed inputs on the host (numpy), before they go to the device."""

    num_reqs: int
    num_tokens: int
    input_ids: np.ndarray  # int64 [T]
    positions: np.ndarray  # int64 [T]
    slot_mapping: np.ndarray  # int64 [T]
    seq_lens: np.ndarray  # int32 [R]
    cu_seqlens_q: np.ndarray  # int32 [R + 1]
    cu_seqlens_k: np.ndarray  # int32 [R + 1]
    block_tables: np.ndarray  # int32 [R, W]: W blocks cover the longest sequence
    max_seqlen_q: int
    max_seqlen_k: int
    logits_indices: np.ndarray  # int64 [N]: the rows whose logits are sampled
    # [N]: index into scheduled_reqs of each sampled row (a verify's 1 + d rows repeat it)
    sample_req_indices: list[int]
    sample_slots: np.ndarray  # int64 [N]: the persistent slot of each sampled row
    sample_num_tokens: np.ndarray  # int64 [N]: known tokens at sampling (the seed's position)

    @property
    def is_pure_decode(self) -> bool:
        return self.num_tokens == self.num_reqs


class PersistentBatch:
    """Slots for the requests being scheduled; ``build`` turns a schedule into HostInputs.

    ``on_new_slot(slot, req)`` is called when a request gets a slot (the sampler stores its
    parameters then)."""

    # Per slot, grown by _allocate: the block table last copied, how much of it, the same
    # count for numpy, and the free slots (popped from the end: lowest first).
    _tables: list[list[int] | None]
    _num_blocks: list[int]
    _num_blocks_np: np.ndarray
    _free: list[int]

    def __init__(self, num_slots: int, max_model_len: int, block_size: int, on_new_slot) -> None:
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.on_new_slot = on_new_slot
        self._slot_of: dict[Request, int] = {}
        self._allocate(max(1, num_slots))

    def _allocate(self, num_slots: int) -> None:
        old = getattr(self, "block_tables", None)
        self.block_tables = np.zeros((num_slots, self.max_blocks_per_seq), dtype=np.int32)
        if old is not None:
            self.block_tables[: old.shape[0]] = old
            self._tables += [None] * (num_slots - len(self._tables))
            self._num_blocks += [0] * (num_slots - len(self._num_blocks))
            self._num_blocks_np = np.concatenate(
                [self._num_blocks_np, np.zeros(num_slots - old.shape[0], np.int64)]
            )
            self._free = list(range(num_slots - 1, old.shape[0] - 1, -1)) + self._free
        else:
            self._tables = [None] * num_slots
            self._num_blocks = [0] * num_slots
            self._num_blocks_np = np.zeros(num_slots, np.int64)
            self._free = list(range(num_slots - 1, -1, -1))
        self.num_slots = num_slots

    def _new_slot(self, req: Request, reqs: list[Request]) -> int:
        if not self._free:
            # Reclaim the slots of requests not in this step (finished, preempted, waiting).
            scheduled = set(reqs)
            for r in [r for r in self._slot_of if r not in scheduled]:
                self._release(r)
        if not self._free:
            self._allocate(self.num_slots * SLOT_GROWTH)
        slot = self._free.pop()
        self._slot_of[req] = slot
        self._tables[slot] = None
        self._num_blocks[slot] = self._num_blocks_np[slot] = 0
        self.on_new_slot(slot, req)
        return slot

    def _release(self, req: Request) -> None:
        slot = self._slot_of.pop(req)
        self._tables[slot] = None
        self._free.append(slot)

    def _sync_blocks(self, slot: int, table: list[int]) -> None:
        n = len(table)
        if table is self._tables[slot]:
            start = self._num_blocks[slot]
            if n > start:
                self.block_tables[slot, start:n] = table[start:]
        else:
            self.block_tables[slot, :n] = table
            self._tables[slot] = table
        self._num_blocks[slot] = self._num_blocks_np[slot] = n

    # ---- one iteration ------------------------------------------------------------------------

    def build(self, reqs: list[Request], num_new: list[int]) -> HostInputs:
        slot_of = self._slot_of
        slots: list[int] = []
        computed: list[int] = []
        known: list[int] = []
        tokens: list[int] = []  # while every row so far is a 1-token row: the tokens
        chunks: list | None = None  # from the first longer chunk on: per-request token lists
        drafts: list[int] | None = None  # speculative decoding: draft rows per request
        add_slot, add_computed, add_known = slots.append, computed.append, known.append
        nblocks = self._num_blocks
        tables = self._tables
        for req, n in zip(reqs, num_new, strict=True):
            slot = slot_of.get(req)
            if slot is None:
                slot = self._new_slot(req, reqs)
            table = req.block_table
            if table is not tables[slot] or len(table) != nblocks[slot]:
                self._sync_blocks(slot, table)
            add_slot(slot)
            c = req.num_computed_tokens
            add_computed(c)
            p = req.num_prompt_tokens
            k = p + req.num_output_tokens
            add_known(k)
            if n == 1:
                if c < p:
                    prompt = req.prompt_token_ids
                    assert prompt is not None, "the torch engine's requests carry their ids"
                    token = prompt[c]
                else:
                    out = req.output_token_ids
                    token = out[c - p] if c - p < len(out) else -1  # -1: rejected in _pack
                if chunks is None:
                    tokens.append(token)
                else:
                    chunks.append((token,))
            else:
                if chunks is None:
                    chunks = [(t,) for t in tokens]
                spec = req.spec_token_ids
                if spec:
                    # A verify: its latest token, then the drafts, which count as known
                    # tokens for this forward (every one of their rows is sampled).
                    if drafts is None:
                        drafts = [0] * len(reqs)
                    drafts[len(slots) - 1] = len(spec)
                    known[-1] = k + len(spec)
                    chunks.append([*req.token_ids_slice(c, k), *spec])
                else:
                    chunks.append(req.token_ids_slice(c, min(c + n, k)))
        return self._pack(reqs, slots, computed, known, num_new, tokens, chunks, drafts)

    def _pack(self, reqs, slots, computed, known, num_new, tokens, chunks, drafts=None) -> HostInputs:
        bs = self.block_size
        num_reqs = len(reqs)
        new = np.asarray(num_new, dtype=np.int64)
        ctx = np.asarray(computed, dtype=np.int64)
        known_arr = np.asarray(known, dtype=np.int64)
        slot_arr = np.asarray(slots, dtype=np.int64)
        seq_lens = ctx + new
        blocks_needed = -(-seq_lens // bs)
        nblocks = self._num_blocks_np[slot_arr]
        bad = (new <= 0) | (seq_lens > known_arr) | (blocks_needed > nblocks)
        if bad.any():
            i = int(np.argmax(bad))
            if blocks_needed[i] > nblocks[i] and new[i] > 0 and seq_lens[i] <= known_arr[i]:
                raise ValueError(
                    f"{reqs[i]!r}: block table has {nblocks[i]} blocks of {bs}, "
                    f"needs {blocks_needed[i]} for {seq_lens[i]} tokens"
                )
            raise ValueError(
                f"{reqs[i]!r}: cannot compute {new[i]} new tokens after "
                f"{ctx[i]} of {known_arr[i]} known tokens"
            )
        cu_q = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(new, out=cu_q[1:])
        num_tokens = int(cu_q[-1])
        if chunks is None:  # every request has one row
            input_ids = np.asarray(tokens, dtype=np.int64)
            positions = ctx
            row_slot = slot_arr
        else:
            input_ids = np.fromiter(itertools.chain.from_iterable(chunks), np.int64, num_tokens)
            row_req = np.repeat(np.arange(num_reqs), new)
            positions = np.arange(num_tokens, dtype=np.int64) - cu_q[:-1][row_req] + ctx[row_req]
            row_slot = slot_arr[row_req]
        # Sample where this chunk reaches the last known token (decodes, completing prefills).
        completes = np.flatnonzero(seq_lens == known_arr)
        logits_indices = cu_q[1:][completes].astype(np.int64) - 1
        sample_reqs = completes
        sample_num_tokens = seq_lens[completes]
        if drafts is not None:
            # A verify samples every one of its 1 + d rows (in order): row j's logits judge
            # draft j + 1, the last row's give the bonus token.
            rows = 1 + np.asarray(drafts, dtype=np.int64)[completes]
            back = np.arange(int(rows.sum()), dtype=np.int64) - np.repeat(np.cumsum(rows) - rows,
                                                                          rows)
            back = np.repeat(rows, rows) - 1 - back  # rows after each sampled row, in its request
            logits_indices = np.repeat(logits_indices, rows) - back
            sample_reqs = np.repeat(completes, rows)
            sample_num_tokens = np.repeat(sample_num_tokens, rows) - back
        return self.host_inputs(slot_arr, input_ids, positions, row_slot, seq_lens, cu_q,
                                int(new.max()), logits_indices, sample_reqs, sample_num_tokens)

    def host_inputs(
        self, slots: np.ndarray, input_ids: np.ndarray, positions: np.ndarray,
        row_slot: np.ndarray, seq_lens: np.ndarray, cu_q: np.ndarray, max_q: int,
        logits_indices: np.ndarray, sample_reqs: np.ndarray, sample_num_tokens: np.ndarray,
    ) -> HostInputs:  # fmt: skip
        """A step's packed inputs from its rows (the full pass above and async scheduling's
        predicted one, async_prepare.py, both end here): every token's KV slot from its
        request's block table, the key offsets, and the block-table rows the step reads.
        ``slots``: each request's slot; ``row_slot``: each token's."""
        bs = self.block_size
        slot_mapping = self.block_tables[row_slot, positions // bs].astype(np.int64) * bs
        slot_mapping += positions % bs
        cu_k = np.zeros(len(slots) + 1, dtype=np.int32)
        np.cumsum(seq_lens, out=cu_k[1:])
        max_k = int(seq_lens.max())
        return HostInputs(
            num_reqs=len(slots),
            num_tokens=int(cu_q[-1]),
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            seq_lens=seq_lens.astype(np.int32),
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            block_tables=self.block_tables[slots, :-(-max_k // bs)],
            max_seqlen_q=max_q,
            max_seqlen_k=max_k,
            logits_indices=logits_indices,
            sample_req_indices=sample_reqs.tolist(),
            sample_slots=slots[sample_reqs],
            sample_num_tokens=sample_num_tokens,
        )
