"""Analytic bytes and FLOPs of one engine iteration, per operator, and a roofline time.

Used three ways: the simulated executor predicts an iteration's time from it; every engine
(simulated or real) records the analytic bytes/FLOPs and the prediction (``predicted_s``) per
iteration; and ``cbbench calibrate`` fits the device rates below to a real run's records.
Formulas (per iteration, per GPU, summed over layers):

- GEMMs (qkv, o, gate_up, down, lm_head): 2 * tokens * params FLOPs; bytes = the weights once
  plus input and output activations. lm_head runs only on rows that sample.
- Attention: 4 * q_heads * head_dim FLOPs per (query, key) pair (QK^T and PV); bytes = every key
  and value the rows read from the cache (a decode row reads its whole history; a prefill chunk
  reads its context once and its own keys) plus q and o. A sliding-window layer (gpt-oss: 12
  of 24 at 128 tokens) reads at most the window per row (``windowed``).
- KV write: kv_bytes_per_token per new token.
- Elementwise (norms, rope, residuals, SiLU*mul) and embedding rows: memory-bound bytes.

Each operator's time is max(FLOPs / flop_rate, bytes / memory_bandwidth), attention's decode
and prefill rows at their own efficiencies (fractions of both rates); the iteration adds a fixed overhead, an overhead per
request row (host work that grows with the batch: building it, sampling) and one per request
with prefill rows (a prefill chunk's own attention call and bookkeeping), and a calibrated
host's time lost to other processes scales the whole. With tensor
parallelism (``tp`` > 1) the GEMMs, attention heads and KV are sharded and every layer adds two
ring all-reduces of the hidden state, plus one all-gather of the logits.

Mixture-of-experts models (engine/moe.py): the MLP's gate_up and down are the experts'
(gate_up also carries the router's h x E GEMM). FLOPs count the k active experts per token;
weight bytes count the experts the batch touches, E * (1 - (1 - k/E)^T) per layer for T tokens
under uniform routing. With expert parallelism (``ep`` > 1) one engine spans ep GPUs: whole
experts spread over them (E/ep each), attention data-parallel (each GPU whole requests, the
attention weights replicated), and every MoE layer adds an all-to-all dispatch of the tokens'
hidden states to their experts' GPUs and one back (combine). Each all-to-all waits for the
slowest GPU, so a step is priced on the busiest one: the ceil(R/ep) of R requests it holds,
and the expected distinct experts on the most-loaded GPU (moe.BusiestGPU), not the average
over GPUs (batch 1 over 8 GPUs: one whole request and one whole expert per layer, not 1/8
and 0.25). Its (token, expert) pairs: the mean T k / ep, at least one per expert it reads.

CostModel.cost sums those operator by operator (``roofline``), or, for a dense model, through
one flat function of the batch's counts that gives the same numbers bit for bit
(``flat_roofline``): the simulators price every step, millions of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

# BatchShape and IterationCost are the step records the engine core reads (core/scheduler_output.py);
# imported here, where the cost model builds them, and for the modules that import them from here.
from ..core.scheduler_output import BatchShape, IterationCost, SchedulerOutput
from ..model_config import DTYPE_BYTES, ModelConfig
from .gpu_specs import GPUSpec
from .moe import BusiestGPU, all_to_all_s, expected_experts_touched

# Efficiency defaults: what well-tuned kernels typically reach on Hopper-class GPUs
# (memory-bound GEMV/attention ~80% of peak HBM bandwidth, large GEMMs ~60% of dense peak).
# They are configurable and can be fitted from a real run (cbbench calibrate).
DEFAULT_ETA_MEMORY = 0.80
DEFAULT_ETA_COMPUTE = 0.60
# CPU/launch overhead per iteration with CUDA graphs for decode; not overlapped in this model.
DEFAULT_ITERATION_OVERHEAD_S = 300e-6
# Elementwise passes over the hidden state per layer (2 RMSNorms, 2 residual adds, rope, act).
ELEMENTWISE_PASSES_PER_LAYER = 8
LOGITS_BYTES = 4  # fp32 logits
# All-reduces per layer under tensor parallelism (Megatron): attention output, MLP output.
ALL_REDUCES_PER_LAYER = 2
# All-to-alls per MoE layer under expert parallelism: dispatch to the experts, combine back.
ALL_TO_ALLS_PER_LAYER = 2
# The fixed cost of one of swap_blocks' copies: its host loop (two .item() reads of the block
# mapping) and one cudaMemcpyAsync. 9 us makes a Llama-8B copy (one layer's K or V of one
# 16-token block, 32 KiB) move at ~3.1 GB/s over a 25 GB/s link, the rate vLLM PR #11531
# measured for V0's swap_blocks on an A100 (3.11 GB/s at 1,250 blocks; 12.6 GB/s once batched
# into one kernel); the PR does not give its block's bytes, so the 32 KiB is an assumption.
SWAP_COPY_LATENCY_S = 9e-6
# Operator order of CostModel.operators(); the attention efficiencies scale attention's.
OPERATORS = ("qkv", "o", "gate_up", "down", "attention", "kv_write", "elementwise", "embedding",
             "lm_head")
ATTENTION_OP = OPERATORS.index("attention")
# (time_s, bytes, flops) of a step from (tokens, logits, key pairs, keys read, requests,
# prefill requests, decode keys)
StepCost = Callable[[int, int, float, float, int, int, float], tuple[float, float, float]]


@dataclass(frozen=True)
class Efficiency:
    """Fractions of a GPU spec's peaks (the uncalibrated simulator's knobs)."""

    eta_memory: float = DEFAULT_ETA_MEMORY
    eta_compute: float = DEFAULT_ETA_COMPUTE
    overhead_s: float = DEFAULT_ITERATION_OVERHEAD_S


@dataclass(frozen=True)
class DeviceRates:
    """What the roofline needs of a device: effective rates (None: that limit is not modelled,
    e.g. a rate a calibration could not identify on a device without a spec) and overheads."""

    memory_bandwidth: float | None  # bytes/s reached
    flop_rate: float | None  # FLOP/s reached
    iteration_overhead_s: float = 0.0
    row_overhead_s: float = 0.0  # per request in the batch
    prefill_overhead_s: float = 0.0  # per request with prefill rows (its own attention call)
    # Attention runs at these fractions of both rates: decode rows (a KV read per row) and
    # prefill rows (a chunk against its context) are different kernels' work.
    decode_attention_efficiency: float = 1.0
    prefill_attention_efficiency: float = 1.0
    # Wall time over the time the work itself takes: what a shared host loses to other
    # processes (a calibrated CPU: the mean measured over the typical one; a GPU: ~1).
    host_factor: float = 1.0

    @staticmethod
    def from_spec(gpu: GPUSpec, eff: Efficiency = Efficiency(), dtype: str = "bf16"
                  ) -> DeviceRates:
        """The spec's peaks times the efficiencies; the FLOP peak is the dtype's (fp32: the
        FP32 peak, a fifteenth of bf16's on an H100: gpu_specs.FP32_FLOPS)."""
        peak = gpu.peak_flops(dtype)
        return DeviceRates(
            memory_bandwidth=gpu.hbm_bandwidth * eff.eta_memory,
            flop_rate=peak * eff.eta_compute if peak else None,
            iteration_overhead_s=eff.overhead_s,
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Interconnect:
    """The link tensor-parallel collectives run over."""

    bandwidth: float  # bytes/s per direction per GPU
    latency_s: float  # per collective

    def all_reduce_s(self, nbytes: float, n: int) -> float:
        """Ring all-reduce of ``nbytes`` over ``n`` GPUs: each sends 2 (n-1)/n of the data."""
        return self.latency_s + 2 * (n - 1) / n * nbytes / self.bandwidth

    def all_gather_s(self, nbytes: float, n: int) -> float:
        """Ring all-gather of a ``nbytes`` result: each GPU receives (n-1)/n of it."""
        return self.latency_s + (n - 1) / n * nbytes / self.bandwidth


class CostModel:
    def __init__(
        self,
        model: ModelConfig,
        dtype: str = "bf16",
        gpu: GPUSpec | None = None,
        efficiency: Efficiency = Efficiency(),
        *,
        rates: DeviceRates | None = None,
        tensor_parallel_size: int = 1,
        expert_parallel_size: int = 1,
    ) -> None:
        """``rates`` (a calibrated device) take precedence over ``gpu`` x ``efficiency``;
        with neither, time_s is None (analytic bytes and FLOPs only)."""
        tp = tensor_parallel_size
        check_tensor_parallel(model, tp)
        check_expert_parallel(model, tp, expert_parallel_size)
        self.model = model
        self.gpu = gpu
        self.eff = efficiency
        self.tp = tp
        self.ep = expert_parallel_size
        if rates is None and gpu is not None:
            rates = DeviceRates.from_spec(gpu, efficiency, dtype)
        self.rates = rates
        self.interconnect = (
            Interconnect(gpu.interconnect_bandwidth, gpu.collective_latency_s)
            if gpu is not None and (tp > 1 or self.ep > 1)
            else None
        )
        if (tp > 1 or self.ep > 1) and self.interconnect is None:
            raise ValueError("tensor or expert parallelism needs a GPU spec with an interconnect")
        db = DTYPE_BYTES[dtype]
        self.dtype_bytes = db
        self._dtype_name = dtype
        m = model
        h, inter, L = m.hidden_size, m.intermediate_size, m.num_layers
        q = m.q_size // tp
        kv = kv_heads_per_gpu(model, tp) * m.head_dim
        # (weight params, input width, output width) per GEMM per layer, per GPU
        self._layer_gemms = [
            (h * (q + 2 * kv), h, q + 2 * kv),
            (q * h, q, h),
            (h * 2 * inter // tp, h, 2 * inter // tp),
            (inter // tp * h, inter // tp, h),
        ]
        self._L = L
        self._q_size = q
        self._kv_bytes_per_token = 2 * L * kv * db
        self._attn_flops_per_pair = 4 * (m.num_heads // tp) * m.head_dim * L
        # Sliding-window layers (model_config.py): their attention reads at most the window's
        # keys per row; the KV write and the KV held are still every layer's (see
        # ``windowed``, and sim_executor.sim_num_kv_blocks for what stays conservative).
        self._window = m.sliding_window if m.has_sliding_window else None
        self._window_layers = m.sliding_window_layers if m.has_sliding_window else 0
        self._kv_bytes_per_layer_token = 2 * kv * db
        self._attn_flops_per_layer_pair = 4 * (m.num_heads // tp) * m.head_dim
        self._vocab = m.vocab_size // tp if tp > 1 else m.vocab_size
        if m.is_moe:
            ie = m.moe_intermediate_size // tp
            bias = m.expert_bias
            # Per expert, per GPU: (gate_up params, down params); biases with their weights.
            self._expert_gate_up = h * 2 * ie + (2 * ie if bias else 0)
            self._expert_down = ie * h + (h if bias else 0)
            self._expert_width = ie
            self._expert_db = m.expert_bytes_per_param(dtype)
            if self.ep > 1:
                self._busiest = BusiestGPU(m.num_experts, m.num_experts_per_tok, self.ep)
        host = gpu.host_bandwidth if gpu is not None else None
        self._host_bandwidth = host or (rates.memory_bandwidth if rates else None)
        self.flat: StepCost | None = flat_roofline(self)  # None where only the operator form holds
        self._min_step_s = self.cost(BatchShape.decodes(1, 1.0)).time_s

    def weight_bytes(self) -> float:
        """All weights of the model (every GPU's shard together; quantized experts at their
        own width)."""
        return float(self.model.weight_bytes(self._dtype_name))

    def _local(self, shape: BatchShape) -> BatchShape:
        """The share of the batch the busiest GPU's attention and dense layers see: all of it,
        or under expert parallelism (attention data-parallel, each GPU whole requests) the
        ceil(R/ep) of the R requests the most-loaded GPU holds, every count scaled by
        ceil(R/ep)/R (requests taken alike). Each MoE layer's all-to-all waits for that GPU:
        a batch-1 decode runs its whole attention, KV read and lm_head on one GPU, not 1/ep of
        them. R a multiple of ep: exactly 1/ep, the even split."""
        if self.ep == 1:
            return shape
        share = self.local_share(shape.num_reqs)
        # Fractional counts: the busiest GPU's share (the roofline is linear in them).
        return BatchShape(shape.num_tokens * share, shape.num_logits * share,  # type: ignore[arg-type]
                          shape.attn_key_pairs * share, shape.attn_keys_read * share,
                          shape.num_reqs * share,  # type: ignore[arg-type]
                          shape.num_prefill_reqs * share,  # type: ignore[arg-type]
                          shape.decode_keys * share)

    def local_share(self, num_reqs: float) -> float:
        """The busiest GPU's share of the batch's requests under expert parallelism:
        ceil(R/ep)/R, 1/ep when R is a multiple of ep (or not a whole count)."""
        n = self.ep
        if num_reqs <= 0 or num_reqs != int(num_reqs):
            return 1.0 / n
        r = int(num_reqs)
        return -(-r // n) / r

    def experts_touched(self, num_tokens: float) -> float:
        """Experts per layer the busiest GPU reads for a batch of ``num_tokens`` (every GPU's
        tokens can route to its experts): on one GPU E (1 - (1 - k/E)^T); over ep GPUs the
        expected distinct experts on the most-loaded one (engine/sim/moe.py BusiestGPU), which
        each layer's all-to-all waits for, not the average E/ep (1 - (1 - k/E)^T)."""
        m = self.model
        if self.ep == 1:
            return expected_experts_touched(m.num_experts, m.num_experts_per_tok, num_tokens)
        return self._busiest.expected_max(num_tokens)

    def _moe_ops(self, shape: BatchShape) -> list[tuple[float, float]]:
        """(FLOPs, bytes) of the MoE MLP on one GPU, all layers: [gate_up + router, down]."""
        m, db, L = self.model, self.dtype_bytes, self._L
        T = shape.num_tokens  # the whole batch: its tokens route to every GPU's experts
        touched = self.experts_touched(T)
        # (token, expert) pairs on the busiest GPU: the mean T k / ep, and at least one per
        # expert it reads (batch 1 over 8 GPUs: 1 pair, not 0.25).
        pairs = T * m.num_experts_per_tok / self.ep
        t_local = T / self.ep
        if self.ep > 1:
            pairs = max(pairs, touched)
            t_local = T * self.local_share(shape.num_reqs)
        router = m.router_params_per_layer
        h, ie, edb = m.hidden_size, self._expert_width, self._expert_db
        gate_up = (
            2.0 * (pairs * self._expert_gate_up + t_local * router) * L,
            (touched * self._expert_gate_up * edb + router * db
             + (t_local * h + pairs * (h + 2 * ie)) * db) * L,
        )
        down = (
            2.0 * pairs * self._expert_down * L,
            (touched * self._expert_down * edb + pairs * (ie + h) * db) * L,
        )
        return [gate_up, down]

    def operators(self, shape: BatchShape) -> list[tuple[float, float]]:
        """(FLOPs, bytes) per operator on one GPU, all layers, in OPERATORS order."""
        full = shape
        shape = self._local(shape)
        db, L, T = self.dtype_bytes, self._L, shape.num_tokens
        h = self.model.hidden_size
        gemms = self._layer_gemms[:2] if self.model.is_moe else self._layer_gemms
        ops: list[tuple[float, float]] = [
            (2.0 * T * params * L, (params + T * (din + dout)) * db * L)
            for params, din, dout in gemms
        ]
        if self.model.is_moe:
            ops += self._moe_ops(full)
        if self._window is None:
            ops.append(
                (
                    self._attn_flops_per_pair * shape.attn_key_pairs,
                    shape.attn_keys_read * self._kv_bytes_per_token
                    + 2 * T * self._q_size * db * L,
                )
            )
        else:
            (fd, bd), (fp, bp) = self.attention_parts(shape, local=False)
            ops.append((fd + fp, bd + bp))
        ops.append((0.0, T * self._kv_bytes_per_token))  # KV write
        ops.append((0.0, ELEMENTWISE_PASSES_PER_LAYER * T * h * db * L))
        ops.append((0.0, T * h * db))  # embedding rows
        vh = self._vocab * h
        ops.append(
            (2.0 * shape.num_logits * vh, vh * db + shape.num_logits * self._vocab * LOGITS_BYTES)
        )
        return ops

    def attention_parts(self, shape: BatchShape, local: bool = True
                        ) -> tuple[tuple[float, float], tuple[float, float]]:
        """The attention operator's (FLOPs, bytes) split into decode rows and prefill rows
        (``local``: ``shape`` is still the whole batch, take the busiest GPU's share)."""
        if local:
            shape = self._local(shape)
        db, L = self.dtype_bytes, self._L
        decode_rows = shape.num_reqs - shape.num_prefill_reqs + shape.num_draft_tokens
        prefill_rows = shape.num_tokens - decode_rows
        qo = 2 * self._q_size * db * L  # q read and o written, per row
        kd = shape.decode_keys
        if self._window is None:
            return (
                (self._attn_flops_per_pair * kd, kd * self._kv_bytes_per_token + decode_rows * qo),
                (
                    self._attn_flops_per_pair * (shape.attn_key_pairs - kd),
                    (shape.attn_keys_read - kd) * self._kv_bytes_per_token + prefill_rows * qo,
                ),
            )
        pairs_p, keys_p = shape.attn_key_pairs - kd, shape.attn_keys_read - kd
        kd_w, pairs_pw, keys_pw = self.windowed(shape)
        full, win = L - self._window_layers, self._window_layers
        afp, kvb = self._attn_flops_per_layer_pair, self._kv_bytes_per_layer_token
        return (
            (afp * (full * kd + win * kd_w), kvb * (full * kd + win * kd_w) + decode_rows * qo),
            (afp * (full * pairs_p + win * pairs_pw),
             kvb * (full * keys_p + win * keys_pw) + prefill_rows * qo),
        )

    def windowed(self, shape: BatchShape) -> tuple[float, float, float]:
        """What one sliding-window layer attends to, from the batch's counts: (keys the decode
        rows read = their key pairs, the other rows' key pairs, the keys those read).

        A row attends to at most ``window`` keys (its own included): a decode row with
        context c reads min(c + 1, window); a prefill chunk of n tokens after c computed ones
        reads min(c + n, n + window - 1) keys and attends sum_{j=c+1}^{c+n} min(j, window)
        pairs. A shape holds sums over rows, not each row's context, so each sum is bounded
        by its rows' caps: decode keys min(sum, rows x window), prefill pairs min(sum,
        tokens x window), prefill keys min(sum, tokens + requests x (window - 1)). Exact
        when every row's context is past the window (a long-context decode: gpt-oss's 128
        tokens) or none is, and never below the truth otherwise (min is concave): a
        windowed layer is never priced faster than it runs. The same counts in every path
        (a stepped engine, a fast-forwarded decode stretch, the array simulator) give the
        same price."""
        w = self._window
        assert w is not None
        kd = shape.decode_keys
        nd = shape.num_reqs - shape.num_prefill_reqs  # decode requests
        decode_rows = nd + shape.num_draft_tokens
        other_rows = shape.num_tokens - nd  # prefill rows and draft rows: a query each
        prefill_tokens = other_rows - shape.num_draft_tokens
        return (
            min(kd, decode_rows * w),
            min(shape.attn_key_pairs - kd, other_rows * w),
            min(shape.attn_keys_read - kd, prefill_tokens + shape.num_prefill_reqs * (w - 1)),
        )

    def communication_s(self, shape: BatchShape) -> float:
        """Tensor-parallel collectives: 2 all-reduces of the hidden state per layer, and the
        all-gather of the sampled rows' logits; expert parallelism's all-to-alls. 0 on one
        GPU."""
        if self.interconnect is None:
            return 0.0
        if self.ep > 1:
            return self.all_to_all_s(shape)
        link, n = self.interconnect, self.tp
        hidden = shape.num_tokens * self.model.hidden_size * self.dtype_bytes
        t = ALL_REDUCES_PER_LAYER * self._L * link.all_reduce_s(hidden, n)
        if shape.num_logits:
            t += link.all_gather_s(shape.num_logits * self.model.vocab_size * LOGITS_BYTES, n)
        return t

    def all_to_all_s(self, shape: BatchShape) -> float:
        """Expert parallelism: per MoE layer, each GPU sends the hidden state of each of its
        (token, expert) pairs to that expert's GPU and gets the result back."""
        m, n, link = self.model, self.ep, self.interconnect
        assert link is not None  # built whenever ep > 1
        per_gpu = shape.num_tokens / n * m.num_experts_per_tok * m.hidden_size * self.dtype_bytes
        one = all_to_all_s(link.bandwidth, link.latency_s, per_gpu, n)
        return ALL_TO_ALLS_PER_LAYER * self._L * one

    def cost(self, shape: BatchShape) -> IterationCost:
        """The step's analytic bytes and FLOPs and its predicted time: through the flat form
        where it applies (``flat``), else operator by operator. The flat form takes keys read
        as a float (as the engine's shapes give them), so that the byte total is a float in
        both forms and a record writes the same number the same way."""
        flat = self.flat
        if flat is None or type(shape.attn_keys_read) is not float:
            return self.roofline(shape)
        time_s, nbytes, flops = flat(shape.num_tokens, shape.num_logits, shape.attn_key_pairs,
                                     shape.attn_keys_read, shape.num_reqs,
                                     shape.num_prefill_reqs, shape.decode_keys)
        return IterationCost(nbytes, flops, time_s, shape)

    def roofline(self, shape: BatchShape) -> IterationCost:
        """The roofline operator by operator: each operator's max(FLOPs / rate, bytes /
        bandwidth), then the overheads and the collectives."""
        ops = self.operators(shape)
        total_flops = sum(f for f, _ in ops)
        total_bytes = sum(b for _, b in ops)
        r = self.rates
        if r is None:
            return IterationCost(total_bytes, total_flops, None, shape)
        fl, bw = r.flop_rate, r.memory_bandwidth
        ed, ep = r.decode_attention_efficiency, r.prefill_attention_efficiency
        ops_s = 0.0
        for i, (f, b) in enumerate(ops):
            if i == ATTENTION_OP and ed != ep:
                # One operator (one kernel over every row), each kind of row at its own pace.
                (fd, bd), (fp, bp) = self.attention_parts(shape)
                f, b = fd / ed + fp / ep, bd / ed + bp / ep
            t = max(f / fl if fl else 0.0, b / bw if bw else 0.0)
            ops_s += t / ed if i == ATTENTION_OP and ed == ep else t
        time_s = ops_s + r.iteration_overhead_s
        if r.row_overhead_s:
            time_s += r.row_overhead_s * shape.num_reqs
        if r.prefill_overhead_s:
            time_s += r.prefill_overhead_s * shape.num_prefill_reqs
        if self.interconnect is not None:
            time_s += self.communication_s(shape)
        if r.host_factor != 1.0:
            time_s *= r.host_factor
        return IterationCost(total_bytes, total_flops, time_s, shape)

    def min_step_s(self) -> float | None:
        """A floor under every non-empty step's predicted time: one decode row reading one
        key (every term of the roofline, the overheads and the collectives grow with the
        batch). None without rates."""
        return self._min_step_s

    def iteration_cost(self, sched: SchedulerOutput) -> IterationCost:
        return self.cost(BatchShape.from_scheduler_output(sched))

    def step_cost(self, sched: SchedulerOutput, block_size: int) -> IterationCost:
        """One engine step: the forward's cost (none for a step that only copies KV blocks)
        and the predicted time, swap copies included."""
        if sched.is_empty:
            cost = IterationCost(0.0, 0.0, 0.0 if self.rates is not None else None)
        else:
            cost = self.iteration_cost(sched)
        swapped = len(sched.swap_out) + len(sched.swap_in)
        if swapped and cost.time_s is not None:
            cost = replace(cost, time_s=cost.time_s + self.swap_time(swapped, block_size))
        return cost

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """One token's K and V on one GPU: every layer, its tensor-parallel shard of the KV
        heads."""
        return self._kv_bytes_per_token

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to copy ``num_blocks`` KV blocks one way between GPU and host memory, as
        vLLM V0 copies them: CacheEngine.swap_in/swap_out call swap_blocks per layer for K and
        for V, and swap_blocks issues one cudaMemcpyAsync per block, so ``blocks x layers x 2``
        copies, each SWAP_COPY_LATENCY_S plus its bytes at the GPU's host bandwidth (PCIe or
        C2C). Not overlapped with the forward: the copies must land before it reads the
        blocks. Not counted in the HBM bytes (another link)."""
        if not self._host_bandwidth or num_blocks == 0:
            return 0.0
        copies = num_blocks * self._L * 2
        nbytes = num_blocks * block_size * self._kv_bytes_per_token
        return copies * SWAP_COPY_LATENCY_S + nbytes / self._host_bandwidth


def flat_roofline(cm: CostModel) -> StepCost | None:
    """CostModel.roofline for a dense model, as one flat function of the batch's counts: the
    same three numbers (predicted time, analytic bytes, analytic FLOPs) from the same counts,
    bit for bit, at about a quarter of the cost (the array simulator prices millions of steps;
    the operator-by-operator form builds nine operator tuples and sums per step):

    - every FLOP and byte count of a dense model is an integer below 2**53 (token counts times
      integer widths; attention's key pairs n*c + n(n+1)/2 are integers), so each is exact in
      a float however it is grouped: the per-operator weights and widths are folded into
      constants once here;
    - the time is the same sum, in the same operator order, of the same max(flops / rate,
      bytes / bandwidth) per operator, then the same overheads in the same order.

    Only where those hold: a dense model without sliding-window layers on one GPU or with
    tensor parallelism, on a device with both rates, decode and prefill attention at one
    efficiency; else None.
    tests/engine/test_array_sim.py compares the two forms on random batches and on every step
    of simulated runs."""
    r = cm.rates
    if (cm.model.is_moe or cm.ep != 1 or r is None or not r.flop_rate or not r.memory_bandwidth
            or r.decode_attention_efficiency != r.prefill_attention_efficiency
            or cm._window is not None):
        return None
    fl, bw = r.flop_rate, r.memory_bandwidth
    eff = r.decode_attention_efficiency
    db, L, h = cm.dtype_bytes, cm._L, cm.model.hidden_size
    # Per GEMM: FLOPs per token, bytes of the weights, bytes per token (exact integers).
    gemms = [(2 * params * L, params * db * L, (din + dout) * db * L)
             for params, din, dout in cm._layer_gemms]
    (f0, w0, a0), (f1, w1, a1), (f2, w2, a2), (f3, w3, a3) = (
        (float(f), float(w), float(a)) for f, w, a in gemms)
    afp = float(cm._attn_flops_per_pair)
    kvb = float(cm._kv_bytes_per_token)
    qo = float(2 * cm._q_size * db * L)  # attention's q read and o written, per token
    elem = float(ELEMENTWISE_PASSES_PER_LAYER * h * db * L)
    emb = float(h * db)
    vh = cm._vocab * h
    head_f = float(2 * vh)
    head_w = float(vh * db)
    head_a = float(cm._vocab * LOGITS_BYTES)
    overhead, row, pre, host = (r.iteration_overhead_s, r.row_overhead_s, r.prefill_overhead_s,
                                r.host_factor)
    comm = cm.communication_s if cm.interconnect is not None else None

    def cost(tokens: int, logits: int, pairs: float, keys_read: float, reqs: int,
             prefill_reqs: int, decode_keys: float) -> tuple[float, float, float]:
        T = float(tokens)
        f_0, f_1, f_2, f_3 = f0 * T, f1 * T, f2 * T, f3 * T
        b_0, b_1, b_2, b_3 = w0 + a0 * T, w1 + a1 * T, w2 + a2 * T, w3 + a3 * T
        f_att = afp * pairs
        b_att = keys_read * kvb + qo * T
        b_kv = T * kvb
        b_elem = elem * T
        b_emb = emb * T
        f_head = head_f * logits
        b_head = head_w + head_a * logits
        # The roofline per operator, in CostModel.operators()'s order (max() inlined: a
        # conditional is a third of its cost; the KV write, elementwise and embedding
        # operators have no FLOPs).
        x, y = f_0 / fl, b_0 / bw
        t = x if x >= y else y
        x, y = f_1 / fl, b_1 / bw
        t += x if x >= y else y
        x, y = f_2 / fl, b_2 / bw
        t += x if x >= y else y
        x, y = f_3 / fl, b_3 / bw
        t += x if x >= y else y
        x, y = f_att / fl, b_att / bw
        t += (x if x >= y else y) / eff
        t += b_kv / bw
        t += b_elem / bw
        t += b_emb / bw
        x, y = f_head / fl, b_head / bw
        t += x if x >= y else y
        t += overhead
        if row:
            t += row * reqs
        if pre:
            t += pre * prefill_reqs
        if comm is not None:
            t += comm(BatchShape(tokens, logits, pairs, keys_read, reqs, prefill_reqs,
                                 decode_keys))
        if host != 1.0:
            t *= host
        nbytes = b_0 + b_1 + b_2 + b_3 + b_att + b_kv + b_elem + b_emb + b_head
        flops = f_0 + f_1 + f_2 + f_3 + f_att + f_head
        return t, nbytes, flops

    return cost


def kv_heads_per_gpu(model: ModelConfig, tp: int) -> int:
    """KV heads each GPU holds: sharded while there are enough, else replicated (vLLM)."""
    return max(1, model.num_kv_heads // tp)


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """vLLM's rule: the query heads split evenly, and the KV heads split evenly or each is
    replicated on a whole number of GPUs."""
    if tp < 1:
        raise ValueError(f"tensor parallel size must be >= 1, got {tp}")
    kvh = model.num_kv_heads
    inter = model.moe_intermediate_size if model.is_moe else model.intermediate_size
    if model.num_heads % tp or inter % tp or (kvh % tp and tp % kvh):
        raise ValueError(
            f"{model.name} ({model.num_heads} heads, {kvh} KV heads) cannot be split "
            f"{tp} ways: the heads must divide evenly"
        )


def check_expert_parallel(model: ModelConfig, tp: int, ep: int) -> None:
    """Expert parallelism needs experts to spread (whole) over the GPUs, and here runs with
    data-parallel attention, so not beside tensor parallelism."""
    if ep < 1:
        raise ValueError(f"expert parallel size must be >= 1, got {ep}")
    if ep == 1:
        return
    if not model.is_moe:
        raise ValueError(f"{model.name} is a dense model: it has no experts to spread")
    if tp > 1:
        raise ValueError("expert parallelism runs attention data-parallel over its GPUs: "
                         "use it with --tensor-parallel-size 1")
    if model.num_experts % ep:
        raise ValueError(f"{model.name}'s {model.num_experts} experts do not spread evenly "
                         f"over {ep} GPUs")
