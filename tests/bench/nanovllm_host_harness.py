"""nano-vllm's host path for one decode step, rewritten as a harness (not its code): the same
data structures and the same work, for tests/bench/bench_host_overhead.py's side-by-side ratio.

Read from GeeeekExplorer/nano-vllm (nanovllm/engine/{llm_engine,scheduler,sequence,
block_manager,model_runner}.py, layers/sampler.py); what one ``LLMEngine.step`` does for a batch
of running decodes:

1. ``Scheduler.schedule``, decode branch: pop each running sequence from a deque, check that a
   block is free if its length is 1 past a block boundary (``can_append``), append a block then
   (``may_append``), and put them back with ``extendleft(reversed(...))``;
2. ``ModelRunner.run``: ``prepare_decode`` (a Python loop building input ids, positions,
   context lengths and slot mappings, each turned into a tensor; ``prepare_block_tables`` pads
   every block table to the longest with -1 and makes one tensor of it), ``prepare_sample``
   (the temperatures tensor), the model (here a no-op returning preallocated logits), the
   sampler and ``.tolist()``;
3. ``Scheduler.postprocess``: ``hash_blocks`` (xxhash64 of a block's token ids when the step
   fills it, chained with the previous block's hash), ``num_cached_tokens`` advanced,
   ``append_token``, the EOS / max-tokens check;
4. the step's ``[(seq_id, completion ids) for seq in seqs if seq.is_finished]``.

On the CPU the tensors are plain host tensors: nano-vllm pins them and copies them to the GPU
with ``non_blocking``; cbbench's own CPU benchmark makes no device copies either. Its sampler
(temperature, softmax, exponential race, argmax; torch.compile'd) is device work on a GPU; the
harness stands in for it with the same greedy argmax cbbench's benchmark counts against itself.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

try:
    import xxhash
except ImportError:  # the benchmark still runs, with Python's hash standing in (recorded)
    xxhash = None

BLOCK_HASH = "xxhash64" if xxhash is not None else "python hash() (xxhash not installed)"


def _block_hash(token_ids: list[int], prefix: int) -> int:
    if xxhash is None:
        return hash((prefix, tuple(token_ids)))
    h = xxhash.xxh64()
    if prefix != -1:
        h.update(prefix.to_bytes(8, "little"))
    h.update(np.array(token_ids).tobytes())
    return h.intdigest()


class Seq:
    """nano-vllm's Sequence: the token list, its counters, its block table."""

    def __init__(self, seq_id: int, token_ids: list[int], max_tokens: int, block_size: int) -> None:
        self.seq_id = seq_id
        self.token_ids = list(token_ids)
        self.last_token = token_ids[-1]
        self.num_tokens = len(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.block_table: list[int] = []
        self.temperature = 1.0
        self.max_tokens = max_tokens
        self.ignore_eos = True
        self.finished = False
        self.block_size = block_size

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def num_blocks(self) -> int:
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self) -> int:
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    def block(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1


class Blocks:
    """nano-vllm's BlockManager, the parts a decode step uses."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free = deque(range(num_blocks))
        self.used: set[int] = set()
        self.hashes = [-1] * num_blocks
        self.block_tokens: list[list[int]] = [[] for _ in range(num_blocks)]
        self.hash_to_block: dict[int, int] = {}

    def allocate_block(self) -> int:
        block = self.free.popleft()
        if self.hashes[block] != -1 and self.hash_to_block.get(self.hashes[block]) == block:
            del self.hash_to_block[self.hashes[block]]
        self.hashes[block] = -1
        self.block_tokens[block] = []
        self.used.add(block)
        return block

    def can_append(self, seq: Seq) -> bool:
        return len(self.free) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq: Seq) -> None:
        if len(seq) % self.block_size == 1:
            seq.block_table.append(self.allocate_block())

    def hash_blocks(self, seq: Seq) -> None:
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        if start == end:
            return
        h = self.hashes[seq.block_table[start - 1]] if start > 0 else -1
        for i in range(start, end):
            block = seq.block_table[i]
            token_ids = seq.block(i)
            h = _block_hash(token_ids, h)
            self.hashes[block] = h
            self.block_tokens[block] = token_ids
            self.hash_to_block[h] = block


class NanoDecodeHarness:
    """``num_running`` sequences already prefilled (prompt cached, one token sampled), stepped
    through nano-vllm's decode host path with a no-op model."""

    def __init__(self, num_running: int, prompt_len: int, max_tokens: int, vocab: int,
                 block_size: int, seed: int = 0) -> None:  # fmt: skip
        rng = np.random.default_rng(seed)
        self.block_size = block_size
        blocks_each = -(-(prompt_len + max_tokens + 1) // block_size)
        self.blocks = Blocks(num_running * blocks_each + 1, block_size)
        self.running: deque[Seq] = deque()
        self.eos = -1
        for i in range(num_running):
            seq = Seq(i, rng.integers(0, vocab, prompt_len).tolist(), max_tokens, block_size)
            for _ in range(seq.num_blocks):
                seq.block_table.append(self.blocks.allocate_block())
            seq.num_cached_tokens = prompt_len  # the prefill step's postprocess, in short
            seq.append_token(int(rng.integers(0, vocab)))
            self.running.append(seq)
        gen = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(max(num_running, 1), vocab, generator=gen)

    # ---- Scheduler.schedule, decode branch ------------------------------------------------------
    def schedule(self) -> list[Seq]:
        scheduled = []
        while self.running:
            seq = self.running.popleft()
            if not self.blocks.can_append(seq):
                raise RuntimeError("the harness sizes its pool so no sequence is preempted")
            seq.num_scheduled_tokens = 1
            self.blocks.may_append(seq)
            scheduled.append(seq)
        self.running.extendleft(reversed(scheduled))
        return scheduled

    # ---- ModelRunner.run ---------------------------------------------------------------------
    def prepare_block_tables(self, seqs: list[Seq]) -> torch.Tensor:
        max_len = max(len(seq.block_table) for seq in seqs)
        tables = [seq.block_table + [-1] * (max_len - len(seq.block_table)) for seq in seqs]
        return torch.tensor(tables, dtype=torch.int32)

    def prepare_decode(self, seqs: list[Seq]):
        input_ids, positions, slot_mapping, context_lens = [], [], [], []
        bs = self.block_size
        for seq in seqs:
            input_ids.append(seq.last_token)
            positions.append(len(seq) - 1)
            context_lens.append(len(seq))
            slot_mapping.append(seq.block_table[-1] * bs + seq.last_block_num_tokens - 1)
        inputs = (
            torch.tensor(input_ids, dtype=torch.int64),
            torch.tensor(positions, dtype=torch.int64),
            torch.tensor(slot_mapping, dtype=torch.int32),
            torch.tensor(context_lens, dtype=torch.int32),
            self.prepare_block_tables(seqs),
        )
        return inputs

    def prepare_sample(self, seqs: list[Seq]) -> torch.Tensor:
        return torch.tensor([seq.temperature for seq in seqs], dtype=torch.float32)

    def run(self, seqs: list[Seq]) -> list[int]:
        self.prepare_decode(seqs)
        self.prepare_sample(seqs)
        logits = self.logits[: len(seqs)]  # the no-op model
        return logits.argmax(dim=-1).tolist()  # the sampler's device work, as cbbench's bench

    # ---- Scheduler.postprocess + LLMEngine.step ------------------------------------------------
    def postprocess(self, seqs: list[Seq], token_ids: list[int]) -> None:
        for seq, token_id in zip(seqs, token_ids, strict=True):
            self.blocks.hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            seq.append_token(token_id)
            if (not seq.ignore_eos and token_id == self.eos) or seq.num_completion_tokens == seq.max_tokens:
                seq.finished = True
                self.running.remove(seq)

    def step(self) -> list:
        seqs = self.schedule()
        token_ids = self.run(seqs)
        self.postprocess(seqs, token_ids)
        return [(seq.seq_id, seq.token_ids[seq.num_prompt_tokens :]) for seq in seqs if seq.finished]
