"""The torch executor's model runner: one scheduler iteration -> one packed forward -> samples.

The scheduler's ``{request: n new tokens}`` becomes ONE flat batch: the rows of request ``i`` are
its tokens ``num_computed_tokens .. num_computed_tokens + n - 1``, and attention sees its cached
context through the metadata. The inputs are built incrementally from per-request slots
(:mod:`.input_batch`) and land in persistent device buffers (:mod:`.device_inputs`).

On CUDA, pure-decode iterations replay CUDA graphs of the whole forward, captured at start-up
for a ladder of padded batch sizes (:mod:`.cuda_graphs`). Padding rows write no KV (slot -1)
and attend one key of their table's first block (seq_len 1): finite garbage never read back.

Mixed prefill + decode iterations (and prefill-only ones) of up to MAX_PIECEWISE_TOKENS tokens
replay piecewise graphs (:mod:`.piecewise`, as vLLM does): the forward cut at attention, the
pieces captured per padded token count, attention run eagerly between them on the real rows.
Larger iterations run eagerly: their GEMMs keep the GPU busy far longer than the host takes
to launch them, and padding them would cost more than launching saves.

A capture that fails leaves that kind of iteration eager, with the reason kept
(``graphs_fallback_reason``, ``mixed_graphs_fallback_reason``).

``async_scheduling``: step n+1's inputs are prepared while step n runs on the device
(:mod:`.async_prepare`, engine/torch/async_prepare.py); the outputs are the same either way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cbbench.kernels import AttentionMetadata

from ..args import DEFAULT_MAX_NUM_SEQS
from ..core.request import SamplingParams
from ..core.scheduler_output import ExecutorOutput, SchedulerOutput
from ..core.spec_decode import accept_greedy
from ..model_config import ModelConfig
from . import async_prepare
from .cuda_graphs import GraphLadder
from .device_inputs import DeviceInputs
from .input_batch import HostInputs, PersistentBatch
from .kv_swap import KVSwapSpace
from .models.llama import KVCache, LlamaForCausalLM
from .piecewise import ForwardPieces
from .sampler import GREEDY_ROWS, RowParams, Sampler, SamplingBatch, SamplingSlots

# Batch sizes with a captured decode graph: fine steps so padding wastes at most 15 rows
# (capped at max_num_seqs, which is always added).

log = logging.getLogger(__name__)

GRAPH_BATCH_SIZES = (1, 2, 4, 8, *range(16, 513, 16))
# Token counts with piecewise graphs for mixed iterations: padding costs at most ~25% of the
# rows; above the largest size an iteration runs eagerly (its GEMMs dwarf the launches).
PIECEWISE_TOKEN_SIZES = (8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
MAX_PIECEWISE_TOKENS = PIECEWISE_TOKEN_SIZES[-1]
PAD_SLOT = -1  # the kernels' "do not write" slot
PAD_SEQ_LEN = 1  # padding rows attend one key: a zero-length softmax would divide by zero
WARMUP_PREFILL_TOKENS = 256
WARMUP_MIXED_DECODES = 8
# Token budget the persistent buffers hold when the caller does not say (vLLM's chunked budget).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass(frozen=True)
class PackedBatch:
    """Device tensors for one forward, plus which rows are sampled for which request."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    metadata: AttentionMetadata
    logits_indices: torch.Tensor | None  # int64 [N]: sampled rows; None = every row, in order
    sample_req_indices: list[int]  # [N]: index into scheduled_reqs of each sampled row
    sampling: RowParams = GREEDY_ROWS
    graph_size: int | None = None  # replay the decode graph of this padded size
    mixed_size: int | None = None  # replay the piecewise graphs of this padded token count

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
        max_num_batched_tokens: int | None = None,
        async_scheduling: bool = False,
    ) -> None:
        self.model = model
        self.async_scheduling = async_scheduling
        self._prediction: async_prepare.Prediction | None = None
        self._last_tokens: list[int] | None = None
        self._pinned_tokens: torch.Tensor | None = None
        self.async_hits = self.async_misses = 0  # steps whose inputs were / were not predicted
        self.config = config
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_num_seqs = max_num_seqs
        self.sampler = Sampler(default_seed=sampler_seed)
        self.sampling_slots = SamplingSlots(max_num_seqs, self.device, sampler_seed)
        self.batch = PersistentBatch(
            max_num_seqs, config.max_model_len, block_size, self.sampling_slots.set
        )
        self.max_blocks_per_seq = self.batch.max_blocks_per_seq
        self.max_num_batched_tokens = max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
        self.inputs = DeviceInputs(
            max_num_seqs,
            self.max_num_batched_tokens,
            self.max_blocks_per_seq,
            self.device,
            persistent=self.device.type == "cuda" or use_cuda_graphs,
        )
        self._compilations = _compilation_counter()
        self._compilations_at_ready: int | None = None
        self.graphs = GraphLadder(self.graph_batch_sizes(), self.device)
        self.mixed_graphs = GraphLadder(
            self.piecewise_token_sizes(), self.device, pieces=config.num_layers + 1
        )
        self.use_cuda_graphs = use_cuda_graphs
        self.graphs_fallback_reason: str | None = None
        self.mixed_graphs_fallback_reason: str | None = None
        if use_cuda_graphs:
            self.capture_decode_graphs()
            self.capture_mixed_graphs()

    @property
    def cuda_graphs_effective(self) -> bool:
        return bool(self.graphs)

    @property
    def mixed_graphs_effective(self) -> bool:
        return bool(self.mixed_graphs)

    # ---- one iteration ------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        """Run the scheduled tokens; sample one token for every request that is now complete.

        Reads ``req.num_computed_tokens`` as the KV already cached; the engine advances it (and
        appends the sampled token) after this returns. Every iteration ends synchronized with
        the device, so its measured time is its own GPU time.
        """
        swap_s = 0.0
        if sched.swap_out or sched.swap_in:
            swap_s = self.swap_blocks(sched.swap_out, sched.swap_in)
        if sched.is_empty:
            self._prediction = None  # it described the step after the last forward
            return ExecutorOutput(sampled_token_ids=[], duration_s=None, swap_time_s=swap_s)
        if self.async_scheduling:
            host = self._host_inputs_async(sched)
            batch = self._prepare_host(host)
        else:
            batch = self.prepare(sched)
        logits = self.compute_logits(batch)
        sampled: list[int | None] = [None] * len(sched.scheduled_reqs)
        accepted = None
        if batch.sample_req_indices:
            rows = self.sampler.sample_rows(logits, batch.sampling)
            if sched.num_drafts:
                # Speculation: the accepted run depends on every row's token, and the next
                # step's shape on how many were accepted, so nothing is predicted ahead.
                self._prediction = None
                tokens = rows.tolist()  # the host sync
                accepted = accept_greedy(sched.scheduled_reqs, batch.sample_req_indices,
                                         tokens, sampled)  # fmt: skip
            else:
                if self.async_scheduling:
                    tokens = self._overlap_next_step(rows, host, sched)
                else:
                    tokens = rows.tolist()  # the host sync
                for i, token in zip(batch.sample_req_indices, tokens, strict=True):
                    sampled[i] = token
            self._keep_pooled(sched, batch)
        else:
            self._prediction = None
            if self.device.type == "cuda":
                # Nothing sampled (only partial prefill chunks): without this sync the
                # forward's GPU time would land in the next iteration's measurement.
                torch.cuda.current_stream(self.device).synchronize()
        return ExecutorOutput(sampled_token_ids=sampled, duration_s=None, swap_time_s=swap_s,
                              num_accepted=accepted)

    # ---- async scheduling (engine/torch/async_prepare.py) ---------------------------------------

    def _host_inputs_async(self, sched: SchedulerOutput):
        """Step n+1's host inputs: the ones predicted during step n when ``sched`` is the
        predicted schedule, else the normal pass."""
        host = async_prepare.take(self._prediction, sched, self._last_tokens, self.batch)
        self._prediction = self._last_tokens = None
        if host is None:
            self.async_misses += 1
            return self.batch.build(sched.scheduled_reqs, sched.num_scheduled_tokens)
        self.async_hits += 1
        return host

    def _overlap_next_step(self, rows: torch.Tensor, host, sched: SchedulerOutput) -> list[int]:
        """The sampled tokens, with step n+1's inputs predicted while the device works. On
        CUDA the tokens' copy to the host is queued behind the forward and waited for after the
        prediction (UNTESTED on a GPU so far: the CPU runs it in order, with the same result)."""
        if self.device.type == "cuda":
            if self._pinned_tokens is None or self._pinned_tokens.numel() < rows.numel():
                self._pinned_tokens = torch.empty(max(rows.numel(), self.max_num_seqs),
                                                  dtype=rows.dtype, pin_memory=True)  # fmt: skip
            pinned = self._pinned_tokens[: rows.numel()]
            pinned.copy_(rows, non_blocking=True)
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            self._prediction = async_prepare.predict(host, sched.scheduled_reqs, self.batch)
            done.synchronize()
            tokens = pinned.tolist()
        else:
            self._prediction = async_prepare.predict(host, sched.scheduled_reqs, self.batch)
            tokens = rows.tolist()
        self._last_tokens = tokens
        return tokens

    @torch.inference_mode()
    def compute_logits(self, batch: PackedBatch) -> torch.Tensor:
        """Forward the packed rows (writing their KV); float32 logits [N, vocab] of sampled rows."""
        hidden = self._forward(batch)
        if batch.logits_indices is not None:
            hidden = hidden[batch.logits_indices]
        self._sampled_hidden = hidden  # the final hidden states of the sampled rows
        return self.model.compute_logits(hidden)

    def _keep_pooled(self, sched: SchedulerOutput, batch: PackedBatch) -> None:
        """An embeddings request's final hidden state at its last prompt token (vLLM's LAST
        pooling), kept on the request when its prefill's row is sampled."""
        reqs = sched.scheduled_reqs
        for row, i in enumerate(batch.sample_req_indices):
            if reqs[i].pooling and reqs[i].pooled_hidden is None:
                reqs[i].pooled_hidden = self._sampled_hidden[row].float().cpu()

    def _forward(self, batch: PackedBatch) -> torch.Tensor:
        if batch.graph_size is not None:
            self.graphs.replay(batch.graph_size)
            return self._g_hidden[: batch.num_reqs]
        if batch.mixed_size is not None:
            size = batch.mixed_size
            return self.pieces.forward(
                lambda piece: self.mixed_graphs.replay(size, piece), self.kv_caches,
                batch.metadata,
            )  # fmt: skip
        return self.model(batch.input_ids, batch.positions, self.kv_caches, batch.metadata)

    # ---- batch construction -------------------------------------------------------------------

    def prepare(self, sched: SchedulerOutput) -> PackedBatch:
        return self._prepare_host(self.batch.build(sched.scheduled_reqs, sched.num_scheduled_tokens))

    def _prepare_host(self, host: HostInputs) -> PackedBatch:
        graph_size = mixed_size = None
        if host.is_pure_decode:
            graph_size = self.graphs.padded_size(host.num_reqs)
        if graph_size is None:
            mixed_size = self.mixed_graphs.padded_size(host.num_tokens)
        return self._upload(host, graph_size, mixed_size)

    def _upload(
        self, host: HostInputs, graph_size: int | None, mixed_size: int | None = None
    ) -> PackedBatch:
        """Host inputs -> device buffers. A decode graph reads ``graph_size`` rows of every
        input (padding requests of one key); piecewise graphs read ``mixed_size`` token rows
        (padding tokens that store nothing), while attention sees the real batch."""
        up = self.inputs.upload
        n = host.num_reqs
        pad_to, pad_cu_k = 0, None
        if graph_size is not None and graph_size > n:
            pad_to = graph_size
            last = int(host.cu_seqlens_k[-1])
            pad_cu_k = last + PAD_SEQ_LEN * np.arange(1, graph_size - n + 1, dtype=np.int32)
        pad_tokens = mixed_size or pad_to
        input_ids = up("input_ids", host.input_ids, pad_tokens, 0)[: host.num_tokens]
        positions = up("positions", host.positions, pad_tokens, 0)[: host.num_tokens]
        # A decode graph reads its own constant cu_seqlens_q (0, 1, 2, ...: _g_cu_q), never the
        # buffer: uploading the host's copy was one host-to-device copy per replay for nothing.
        cu_q = self._g_cu_q[: n + 1] if graph_size is not None else up("cu_seqlens_q", host.cu_seqlens_q)
        metadata = AttentionMetadata(
            cu_seqlens_q=cu_q,
            seq_lens=up("seq_lens", host.seq_lens, pad_to, PAD_SEQ_LEN)[:n],
            max_seqlen_q=host.max_seqlen_q,
            max_seqlen_k=host.max_seqlen_k,
            block_tables=self.inputs.upload_block_tables(host.block_tables),
            slot_mapping=up("slot_mapping", host.slot_mapping, pad_tokens, PAD_SLOT)[
                : host.num_tokens
            ],
            block_size=self.block_size,
            cu_seqlens_k=up("cu_seqlens_k", host.cu_seqlens_k, pad_to + 1 if pad_to else 0,
                            pad_cu_k)[: n + 1],
        )  # fmt: skip
        every_row = len(host.sample_req_indices) == host.num_tokens
        return PackedBatch(
            input_ids=input_ids,
            positions=positions,
            metadata=metadata,
            logits_indices=None if every_row else up("logits_indices", host.logits_indices),
            sample_req_indices=host.sample_req_indices,
            sampling=self.sampling_slots.rows(host.sample_slots, host.sample_num_tokens, up),
            graph_size=graph_size,
            mixed_size=mixed_size,
        )

    # ---- swap preemption: KV blocks to and from a CPU pool (engine/torch/kv_swap.py) -------------------

    def allocate_swap_space(self, num_cpu_blocks: int) -> None:
        self.swap = KVSwapSpace(self.kv_caches, num_cpu_blocks, self.dtype, self.device)

    def swap_blocks(
        self, swap_out: Sequence[tuple[int, int]], swap_in: Sequence[tuple[int, int]]
    ) -> float:
        return self.swap.swap_blocks(swap_out, swap_in)

    # ---- warm-up ------------------------------------------------------------------------------

    @torch.inference_mode()
    def warmup(self, num_tokens: int = WARMUP_PREFILL_TOKENS) -> None:
        """Run throwaway prefill, decode and mixed passes and every sampling path, so kernel
        compilation (each launch shape's Triton variant), allocator and cuBLAS workspace growth
        happen before anything is timed. Writes no KV. Then marks the compilation count that
        ``kernel_compilations_since_ready`` counts from."""
        max_len = self.config.max_model_len
        num_tokens = max(1, min(num_tokens, max_len))
        decodes = min(WARMUP_MIXED_DECODES, self.max_num_seqs)
        shapes = [
            ([num_tokens], None),  # prefill
            ([1], max_len),  # decode, one long sequence: the split-K path
            ([1], None),  # decode, short: the one-pass path
            ([1] * decodes + [max(2, num_tokens // 2)], None),  # mixed
        ]
        if self.device.type == "cuda":  # the allocator's and cuBLAS's largest decode shape
            shapes.append(([1] * self.max_num_seqs, None))
        greedy = SamplingParams()
        sampling = (
            greedy,
            SamplingParams(temperature=1.0, top_k=50),
            SamplingParams(temperature=1.0, top_k=50, top_p=0.9),
        )
        for q_lens, max_seqlen_k in shapes:
            logits = self.compute_logits(self._dummy_batch(q_lens, max_seqlen_k))
            for params in sampling:
                self.sampler.sample(logits, _sampling_batch_of([params] * logits.shape[0]))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.mark_ready()

    def mark_ready(self) -> None:
        """From here on the run is timed: kernel compilations are counted from now."""
        c = self._compilations
        self._compilations_at_ready = c.count if c is not None and c.available else None

    def kernel_compilations_since_ready(self) -> int | None:
        """Triton kernels compiled since ``mark_ready`` (0 is the goal); None when Triton's
        compilation hook is not available."""
        if self._compilations_at_ready is None:
            return None
        return self._compilations.count - self._compilations_at_ready

    def _dummy_batch(self, q_lens: list[int], max_seqlen_k: int | None = None) -> PackedBatch:
        """Rows that write nothing (slot -1) and read block 0 only; ``max_seqlen_k`` may claim
        more keys than the rows have (it picks the attention kernels' launch shape)."""
        num_reqs, num_tokens = len(q_lens), sum(q_lens)
        dev = self.device
        q = torch.tensor(q_lens, dtype=torch.int32, device=dev)
        cu = torch.zeros(num_reqs + 1, dtype=torch.int32, device=dev)
        cu[1:] = q.cumsum(0)
        width = -(-max(q_lens) // self.block_size)
        metadata = AttentionMetadata(
            cu_seqlens_q=cu,
            seq_lens=q,
            max_seqlen_q=max(q_lens),
            max_seqlen_k=max(max(q_lens), max_seqlen_k or 0),
            block_tables=torch.zeros(num_reqs, width, dtype=torch.int32, device=dev),
            slot_mapping=torch.full((num_tokens,), PAD_SLOT, dtype=torch.int64, device=dev),
            block_size=self.block_size,
            cu_seqlens_k=cu.clone(),
        )
        positions = torch.cat([torch.arange(n, device=dev) for n in q_lens])
        return PackedBatch(
            input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=dev),
            positions=positions,
            metadata=metadata,
            logits_indices=cu[1:].long() - 1,
            sample_req_indices=list(range(num_reqs)),
        )

    # ---- CUDA graphs for pure-decode iterations -----------------------------------------------

    def graph_batch_sizes(self) -> list[int]:
        """Padded batch sizes that get a decode graph: the ladder, capped by max_num_seqs."""
        return sorted({s for s in GRAPH_BATCH_SIZES if s < self.max_num_seqs} | {self.max_num_seqs})

    def piecewise_token_sizes(self) -> list[int]:
        """Padded token counts with piecewise graphs, within the token budget."""
        cap = min(self.max_num_batched_tokens, MAX_PIECEWISE_TOKENS)
        return sorted({s for s in PIECEWISE_TOKEN_SIZES if s < cap} | {cap})

    @torch.inference_mode()
    def capture_decode_graphs(self) -> bool:
        """Capture the decode ladder; on failure decode runs eagerly and the one-line reason
        is kept (and logged). Returns whether graphs are in use."""
        dev = self.device
        max_bs = self.max_num_seqs
        # Static inputs: the persistent buffers. cu_seqlens_q of a decode batch is always
        # 0, 1, 2, ...: a constant of its own.
        self._g_cu_q = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self._g_hidden = torch.zeros(max_bs, self.config.hidden_size, dtype=self.dtype, device=dev)
        buf = self.inputs.dev
        buf["seq_lens"].fill_(PAD_SEQ_LEN)
        buf["slot_mapping"].fill_(PAD_SLOT)
        buf["cu_seqlens_k"].copy_(self._g_cu_q * PAD_SEQ_LEN)
        reason = self.graphs.capture(self._graph_body)
        if reason is not None:
            self.graphs_fallback_reason = reason
            log.info(f"CUDA graph capture failed, decoding eagerly: {reason}")
        return reason is None

    @torch.inference_mode()
    def capture_mixed_graphs(self) -> bool:
        """Capture the piecewise graphs of mixed iterations; on failure they run eagerly and
        the reason is kept (and logged). Returns whether they are in use."""
        max_tokens = max(self.mixed_graphs.sizes)
        self.pieces = ForwardPieces(self.model, max_tokens, self.dtype, self.device)
        self.inputs.dev["slot_mapping"].fill_(PAD_SLOT)  # capture warm-ups store nothing
        reason = self.mixed_graphs.capture(self._piece_body, pool=self.graphs.pool)
        if reason is not None:
            self.mixed_graphs_fallback_reason = reason
            log.info(f"CUDA graph capture failed for mixed iterations, running them eagerly: "
                     f"{reason}")
        return reason is None

    def _piece_body(self, size: int, piece: int) -> None:
        buf = self.inputs.dev
        self.pieces.run_piece(
            piece, buf["input_ids"][:size], buf["positions"][:size], buf["slot_mapping"][:size],
            self.kv_caches,
        )  # fmt: skip

    def _graph_metadata(self, bs: int) -> AttentionMetadata:
        # max_seqlen_k is baked into the graph, so it is the bound every replay satisfies.
        buf = self.inputs.dev
        return AttentionMetadata(
            cu_seqlens_q=self._g_cu_q[: bs + 1],
            seq_lens=buf["seq_lens"][:bs],
            max_seqlen_q=1,
            max_seqlen_k=self.config.max_model_len,
            block_tables=buf["block_tables"][:bs],
            slot_mapping=buf["slot_mapping"][:bs],
            block_size=self.block_size,
            cu_seqlens_k=buf["cu_seqlens_k"][: bs + 1],
        )

    def _graph_body(self, bs: int, piece: int = 0) -> None:
        buf = self.inputs.dev
        hidden = self.model(
            buf["input_ids"][:bs], buf["positions"][:bs], self.kv_caches, self._graph_metadata(bs)
        )
        self._g_hidden[:bs] = hidden


def _sampling_batch_of(params: list[SamplingParams]) -> SamplingBatch:
    return SamplingBatch(
        temperatures=[p.temperature for p in params],
        top_ks=[p.top_k for p in params],
        top_ps=[p.top_p for p in params],
        seeds=list(range(len(params))),
    )


def _compilation_counter():
    """The kernels package's Triton compilation counter, or None where it does not exist."""
    try:
        from cbbench.kernels.compilation import compilation_counter
    except ImportError:
        return None
    return compilation_counter()
