"""The torch executor's model runner: one scheduler iteration -> one packed forward -> samples.

The scheduler's ``{request: n new tokens}`` becomes ONE flat batch: the rows of request ``i`` are
its tokens ``num_computed_tokens .. num_computed_tokens + n - 1``, and attention sees its cached
context through the metadata. Batch construction is vectorized with numpy; the only Python loop
is per request (gathering its token ids and block table).

On CUDA, pure-decode iterations (every request has exactly one new row) replay CUDA graphs
captured at start-up for a ladder of padded batch sizes. Padding rows write no KV (slot -1) and
attend one key of block 0 (seq_len 1): finite garbage that is never read back.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch

from cbbench.kernels import AttentionMetadata

from .args import DEFAULT_MAX_NUM_SEQS
from .model_config import ModelConfig
from .models.llama import KVCache, LlamaForCausalLM
from .request import SamplingParams
from .sampler import Sampler, SamplingBatch
from .scheduler_output import ExecutorOutput, SchedulerOutput

# Batch sizes with a captured decode graph: fine steps so padding wastes at most 15 rows
# (capped at max_num_seqs, which is always added).
GRAPH_BATCH_SIZES = (1, 2, 4, 8, *range(16, 513, 16))
PAD_SLOT = -1  # the kernels' "do not write" slot
PAD_SEQ_LEN = 1  # padding rows attend one key: a zero-length softmax would divide by zero
WARMUP_PREFILL_TOKENS = 256


@dataclass(frozen=True)
class PackedBatch:
    """Device tensors for one forward, plus which rows are sampled for which request."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # int64 [N]: the rows whose logits are sampled
    sample_req_indices: list[int]  # [N]: index into scheduled_reqs of each sampled row

    @property
    def num_reqs(self) -> int:
        return self.metadata.num_reqs

    @property
    def is_pure_decode(self) -> bool:
        return self.metadata.max_seqlen_q == 1


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        config: ModelConfig,
        kv_caches: list[KVCache],
        block_size: int,
        device: torch.device | str,
        dtype: torch.dtype,
        use_cuda_graphs: bool = False,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        sampler_seed: int = 0,
    ) -> None:
        self.model = model
        self.config = config
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_num_seqs = max_num_seqs
        self.sampler = Sampler(default_seed=sampler_seed)
        self.max_blocks_per_seq = -(-config.max_model_len // block_size)
        self.use_cuda_graphs = use_cuda_graphs
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if use_cuda_graphs:
            if self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
            self._capture_decode_graphs()

    # ---- one iteration ------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        """Run the scheduled tokens; sample one token for every request that is now complete.

        Reads ``req.num_computed_tokens`` as the KV already cached; the engine advances it (and
        appends the sampled token) after this returns.
        """
        swap_s = 0.0
        if sched.swap_out or sched.swap_in:
            swap_s = self.swap_blocks(sched.swap_out, sched.swap_in)
        if sched.is_empty:
            return ExecutorOutput(sampled_token_ids=[], duration_s=None, swap_time_s=swap_s)
        batch = self.prepare(sched)
        logits = self.compute_logits(batch)
        sampled: list[int | None] = [None] * len(sched.scheduled_reqs)
        if batch.sample_req_indices:
            reqs = [sched.scheduled_reqs[i] for i in batch.sample_req_indices]
            tokens = self.sampler(logits, reqs).tolist()  # the iteration's one host sync
            for i, token in zip(batch.sample_req_indices, tokens, strict=True):
                sampled[i] = token
        return ExecutorOutput(sampled_token_ids=sampled, duration_s=None, swap_time_s=swap_s)

    @torch.inference_mode()
    def compute_logits(self, batch: PackedBatch) -> torch.Tensor:
        """Forward the packed rows (writing their KV); float32 logits [N, vocab] of sampled rows."""
        hidden = self._forward(batch)
        return self.model.compute_logits(hidden[batch.logits_indices])

    def _forward(self, batch: PackedBatch) -> torch.Tensor:
        if self._graphs and batch.is_pure_decode and batch.num_reqs <= max(self._graphs):
            return self._replay_decode_graph(batch)
        return self.model(batch.input_ids, batch.positions, self.kv_caches, batch.metadata)

    # ---- swap preemption: KV blocks to and from a CPU pool --------------------------------------

    def allocate_swap_space(self, num_cpu_blocks: int) -> None:
        """The CPU block pool, laid out as the device cache ([blocks, block_size, kv_heads,
        head_dim] per layer, K and V); pinned on CUDA so copies run at full host bandwidth.
        ``empty``, not ``zeros``: a block is read only after a swap-out has written it."""
        pin = self.device.type == "cuda"
        shape = (num_cpu_blocks, *self.kv_caches[0][0].shape[1:])
        self.cpu_kv_caches = [
            tuple(
                torch.empty(shape, dtype=self.dtype, device="cpu", pin_memory=pin)
                for _ in range(2)
            )
            for _ in self.kv_caches
        ]

    @torch.inference_mode()
    def swap_blocks(
        self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]
    ) -> float:
        """Copy (device block, CPU block) pairs out, then (CPU block, device block) pairs in:
        in that order, because a device block freed by a swap-out may receive a swap-in in the
        same step. Synchronous (the forward reads the swapped-in blocks, and the next step's
        swap-out may overwrite a CPU block read now). Returns the seconds spent."""
        t0 = time.perf_counter()
        dev = self.device
        if swap_out:
            src = torch.tensor([g for g, _ in swap_out], dtype=torch.int64, device=dev)
            dst = torch.tensor([c for _, c in swap_out], dtype=torch.int64)
            for gpu_kv, cpu_kv in zip(self.kv_caches, self.cpu_kv_caches, strict=True):
                for gpu_cache, cpu_cache in zip(gpu_kv, cpu_kv, strict=True):
                    cpu_cache[dst] = gpu_cache[src].to("cpu")
        if swap_in:
            src = torch.tensor([c for c, _ in swap_in], dtype=torch.int64)
            dst = torch.tensor([g for _, g in swap_in], dtype=torch.int64, device=dev)
            for gpu_kv, cpu_kv in zip(self.kv_caches, self.cpu_kv_caches, strict=True):
                for gpu_cache, cpu_cache in zip(gpu_kv, cpu_kv, strict=True):
                    gpu_cache[dst] = cpu_cache[src].to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    # ---- batch construction -------------------------------------------------------------------

    def prepare(self, sched: SchedulerOutput) -> PackedBatch:
        reqs = sched.scheduled_reqs
        num_reqs = len(reqs)
        bs = self.block_size
        num_new = np.asarray(sched.num_scheduled_tokens, dtype=np.int64)
        num_computed = np.fromiter((r.num_computed_tokens for r in reqs), np.int64, num_reqs)
        num_known = np.fromiter((r.num_tokens for r in reqs), np.int64, num_reqs)
        seq_lens = num_computed + num_new
        if (num_new <= 0).any() or (seq_lens > num_known).any():
            bad = int(np.argmax((num_new <= 0) | (seq_lens > num_known)))
            raise ValueError(
                f"{reqs[bad]!r}: cannot compute {num_new[bad]} new tokens after "
                f"{num_computed[bad]} of {num_known[bad]} known tokens"
            )
        cu_q = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(num_new, out=cu_q[1:])
        num_tokens = int(cu_q[-1])

        token_ids = np.fromiter(
            itertools.chain.from_iterable(
                r.token_ids_slice(int(c), int(s))
                for r, c, s in zip(reqs, num_computed, seq_lens, strict=True)
            ),
            np.int64,
            num_tokens,
        )
        row_req = np.repeat(np.arange(num_reqs), num_new)  # request index of each row
        positions = np.arange(num_tokens) - cu_q[:-1][row_req] + num_computed[row_req]

        blocks_needed = -(-seq_lens // bs)
        block_tables = np.zeros((num_reqs, int(blocks_needed.max())), dtype=np.int32)
        for i, req in enumerate(reqs):
            n = int(blocks_needed[i])
            if len(req.block_table) < n:
                raise ValueError(
                    f"{req!r}: block table has {len(req.block_table)} blocks of {bs}, "
                    f"needs {n} for {seq_lens[i]} tokens"
                )
            block_tables[i, :n] = req.block_table[:n]
        slot_mapping = block_tables[row_req, positions // bs].astype(np.int64) * bs + positions % bs

        # Sample where this chunk reaches the last known token (decodes, completing prefills).
        completes = np.flatnonzero(seq_lens == num_known)
        logits_indices = cu_q[1:][completes] - 1
        cu_k = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(seq_lens, out=cu_k[1:])

        metadata = AttentionMetadata(
            cu_seqlens_q=self._to_device(cu_q, torch.int32),
            seq_lens=self._to_device(seq_lens, torch.int32),
            max_seqlen_q=int(num_new.max()),
            max_seqlen_k=int(seq_lens.max()),
            block_tables=self._to_device(block_tables, torch.int32),
            slot_mapping=self._to_device(slot_mapping, torch.int64),
            block_size=bs,
            cu_seqlens_k=self._to_device(cu_k, torch.int32),
        )
        return PackedBatch(
            input_ids=self._to_device(token_ids, torch.int64),
            positions=self._to_device(positions, torch.int64),
            metadata=metadata,
            logits_indices=self._to_device(logits_indices, torch.int64),
            sample_req_indices=completes.tolist(),
        )

    def _to_device(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(
            self.device, dtype, non_blocking=True
        )

    # ---- warm-up ------------------------------------------------------------------------------

    @torch.inference_mode()
    def warmup(self, num_tokens: int = WARMUP_PREFILL_TOKENS) -> None:
        """Run a throwaway prefill, decode and sampling pass (kernel compilation, allocator and
        cuBLAS workspace growth) so the first timed iteration is not an outlier. Writes no KV."""
        num_tokens = max(1, min(num_tokens, self.config.max_model_len))
        for rows in (num_tokens, 1):
            batch = self._dummy_batch(num_reqs=1, rows_per_req=rows)
            logits = self.compute_logits(batch)
            greedy = SamplingParams()
            sampled = SamplingParams(temperature=1.0, top_k=50, top_p=0.9)
            self.sampler.sample(logits, _sampling_batch_of([greedy]))
            self.sampler.sample(logits, _sampling_batch_of([sampled]))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _dummy_batch(self, num_reqs: int, rows_per_req: int) -> PackedBatch:
        """Rows that write nothing (slot -1) and read block 0 only."""
        num_tokens = num_reqs * rows_per_req
        seq_lens = torch.full((num_reqs,), rows_per_req, dtype=torch.int32, device=self.device)
        cu = torch.arange(num_reqs + 1, dtype=torch.int32, device=self.device) * rows_per_req
        width = -(-rows_per_req // self.block_size)
        metadata = AttentionMetadata(
            cu_seqlens_q=cu,
            seq_lens=seq_lens,
            max_seqlen_q=rows_per_req,
            max_seqlen_k=rows_per_req,
            block_tables=torch.zeros(num_reqs, width, dtype=torch.int32, device=self.device),
            slot_mapping=torch.full((num_tokens,), PAD_SLOT, dtype=torch.int64, device=self.device),
            block_size=self.block_size,
            cu_seqlens_k=cu.clone(),
        )
        positions = torch.arange(rows_per_req, device=self.device).repeat(num_reqs)
        return PackedBatch(
            input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=self.device),
            positions=positions,
            metadata=metadata,
            logits_indices=cu[1:].long() - 1,
            sample_req_indices=list(range(num_reqs)),
        )

    # ---- CUDA graphs for pure-decode iterations -----------------------------------------------

    def graph_batch_sizes(self) -> list[int]:
        """Padded batch sizes that get a decode graph: the ladder, capped by max_num_seqs."""
        return sorted({s for s in GRAPH_BATCH_SIZES if s < self.max_num_seqs} | {self.max_num_seqs})

    def _allocate_graph_buffers(self) -> None:
        """Static buffers every graph reads and writes; replay copies a batch into a prefix."""
        max_bs, dev = self.max_num_seqs, self.device
        self._g_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self._g_positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self._g_slots = torch.full((max_bs,), PAD_SLOT, dtype=torch.int64, device=dev)
        self._g_seq_lens = torch.full((max_bs,), PAD_SEQ_LEN, dtype=torch.int32, device=dev)
        self._g_cu_q = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)  # one row each
        self._g_cu_k = torch.arange(max_bs + 1, dtype=torch.int32, device=dev) * PAD_SEQ_LEN
        self._g_block_tables = torch.zeros(
            max_bs, self.max_blocks_per_seq, dtype=torch.int32, device=dev
        )
        self._g_hidden = torch.zeros(max_bs, self.config.hidden_size, dtype=self.dtype, device=dev)

    @torch.inference_mode()
    def _capture_decode_graphs(self) -> None:
        dev = self.device
        self._allocate_graph_buffers()
        pool = None
        # Largest first, so the smaller graphs fit in the memory pool the largest one made.
        for bs in reversed(self.graph_batch_sizes()):
            metadata = self._graph_metadata(bs)
            try:
                self._g_hidden[:bs] = self._graph_body(bs, metadata)  # warm-up outside capture
                torch.cuda.synchronize(dev)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._g_hidden[:bs] = self._graph_body(bs, metadata)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"CUDA graph capture failed with attention backend "
                    f"{getattr(self.model.attn_backend, 'name', '?')!r}"
                    f" (its write_kv/forward must not sync with the host; the triton backend "
                    f"is capture-safe), or run without CUDA graphs: {exc}"
                ) from exc
            pool = graph.pool()
            self._graphs[bs] = graph
        torch.cuda.synchronize(dev)

    def _graph_metadata(self, bs: int) -> AttentionMetadata:
        # max_seqlen_k is baked into the graph, so it is the bound every replay satisfies.
        return AttentionMetadata(
            cu_seqlens_q=self._g_cu_q[: bs + 1],
            seq_lens=self._g_seq_lens[:bs],
            max_seqlen_q=1,
            max_seqlen_k=self.config.max_model_len,
            block_tables=self._g_block_tables[:bs],
            slot_mapping=self._g_slots[:bs],
            block_size=self.block_size,
            cu_seqlens_k=self._g_cu_k[: bs + 1],
        )

    def _graph_body(self, bs: int, metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(self._g_input_ids[:bs], self._g_positions[:bs], self.kv_caches, metadata)

    def _replay_decode_graph(self, batch: PackedBatch) -> torch.Tensor:
        n = batch.num_reqs
        bs = min(s for s in self._graphs if s >= n)
        md = batch.metadata
        self._g_input_ids[:n] = batch.input_ids
        self._g_positions[:n] = batch.positions
        self._g_slots[:n] = md.slot_mapping
        self._g_seq_lens[:n] = md.seq_lens
        self._g_block_tables[:n, : md.block_tables.shape[1]] = md.block_tables
        self._g_cu_k[: n + 1] = md.cu_seqlens_k
        if bs > n:  # reset the padding rows a larger earlier batch may have filled
            self._g_input_ids[n:bs] = 0
            self._g_positions[n:bs] = 0
            self._g_slots[n:bs] = PAD_SLOT
            self._g_seq_lens[n:bs] = PAD_SEQ_LEN
            self._g_cu_k[n + 1 : bs + 1] = md.cu_seqlens_k[n] + PAD_SEQ_LEN * torch.arange(
                1, bs - n + 1, dtype=torch.int32, device=self.device
            )
        self._graphs[bs].replay()
        return self._g_hidden[:n]


def _sampling_batch_of(params: list[SamplingParams]) -> SamplingBatch:
    return SamplingBatch(
        temperatures=[p.temperature for p in params],
        top_ks=[p.top_k for p in params],
        top_ps=[p.top_p for p in params],
        seeds=[0] * len(params),
    )
