"""Analytic bytes and FLOPs of one engine iteration, per operator, and a roofline time.

Used three ways: the simulated executor predicts an iteration's time from it; every engine
(simulated or real) records the analytic bytes/FLOPs and the prediction (``predicted_s``) per
iteration; and ``cbbench calibrate`` fits the device rates below to a real run's records.
Formulas (per iteration, per GPU, summed over layers):

- GEMMs (qkv, o, gate_up, down, lm_head): 2 * tokens * params FLOPs; bytes = the weights once
  plus input and output activations. lm_head runs only on rows that sample.
- Attention: 4 * q_heads * head_dim FLOPs per (query, key) pair (QK^T and PV); bytes = every key
  and value the rows read from the cache (a decode row reads its whole history; a prefill chunk
  reads its context once and its own keys) plus q and o.
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
experts spread over them (E/ep each), attention data-parallel (each GPU a 1/ep share of the
rows, the attention weights replicated), and every MoE layer adds an all-to-all dispatch of
the tokens' hidden states to their experts' GPUs and one back (combine).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

# BatchShape and IterationCost are the step records the engine core reads (core/scheduler_output.py);
# imported here, where the cost model builds them, and for the modules that import them from here.
from ..core.scheduler_output import BatchShape, IterationCost, SchedulerOutput
from ..model_config import DTYPE_BYTES, ModelConfig
from .gpu_specs import GPUSpec
from .moe import all_to_all_s, expected_experts_touched

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
# Operator order of CostModel.operators(); the attention efficiencies scale attention's.
OPERATORS = ("qkv", "o", "gate_up", "down", "attention", "kv_write", "elementwise", "embedding",
             "lm_head")
ATTENTION_OP = OPERATORS.index("attention")


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
    def from_spec(gpu: GPUSpec, eff: Efficiency = Efficiency()) -> DeviceRates:
        return DeviceRates(
            memory_bandwidth=gpu.hbm_bandwidth * eff.eta_memory,
            flop_rate=gpu.bf16_flops * eff.eta_compute,
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
            rates = DeviceRates.from_spec(gpu, efficiency)
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
        self._vocab = m.vocab_size // tp if tp > 1 else m.vocab_size
        if m.is_moe:
            ie = m.moe_intermediate_size // tp
            bias = m.expert_bias
            # Per expert, per GPU: (gate_up params, down params); biases with their weights.
            self._expert_gate_up = h * 2 * ie + (2 * ie if bias else 0)
            self._expert_down = ie * h + (h if bias else 0)
            self._expert_width = ie
            self._expert_db = m.expert_bytes_per_param(dtype)
        host = gpu.host_bandwidth if gpu is not None else None
        self._host_bandwidth = host or (rates.memory_bandwidth if rates else None)
        self._min_step_s = self.cost(BatchShape.decodes(1, 1.0)).time_s

    def weight_bytes(self) -> float:
        """All weights of the model (every GPU's shard together; quantized experts at their
        own width)."""
        return float(self.model.weight_bytes(self._dtype_name))

    def _local(self, shape: BatchShape) -> BatchShape:
        """The share of the batch one GPU's attention and dense layers see: all of it, or
        1/ep of its rows under expert parallelism (attention data-parallel)."""
        if self.ep == 1:
            return shape
        n = self.ep
        # Fractional counts: the expected share of one GPU (the roofline is linear in them).
        return BatchShape(shape.num_tokens / n, shape.num_logits / n,  # type: ignore[arg-type]
                          shape.attn_key_pairs / n, shape.attn_keys_read / n,
                          shape.num_reqs / n, shape.num_prefill_reqs / n,  # type: ignore[arg-type]
                          shape.decode_keys / n)

    def experts_touched(self, num_tokens: float) -> float:
        """Experts per layer one GPU reads for a batch of ``num_tokens`` (every GPU's tokens
        can route to its experts): E/ep * (1 - (1 - k/E)^T)."""
        m = self.model
        return expected_experts_touched(m.num_experts, m.num_experts_per_tok,
                                        num_tokens) / self.ep

    def _moe_ops(self, shape: BatchShape) -> list[tuple[float, float]]:
        """(FLOPs, bytes) of the MoE MLP on one GPU, all layers: [gate_up + router, down]."""
        m, db, L = self.model, self.dtype_bytes, self._L
        T = shape.num_tokens  # the whole batch: its tokens route to every GPU's experts
        pairs = T * m.num_experts_per_tok / self.ep  # (token, expert) pairs on this GPU
        touched = self.experts_touched(T)
        t_local = T / self.ep
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
        ops.append(
            (
                self._attn_flops_per_pair * shape.attn_key_pairs,
                shape.attn_keys_read * self._kv_bytes_per_token + 2 * T * self._q_size * db * L,
            )
        )
        ops.append((0.0, T * self._kv_bytes_per_token))  # KV write
        ops.append((0.0, ELEMENTWISE_PASSES_PER_LAYER * T * h * db * L))
        ops.append((0.0, T * h * db))  # embedding rows
        vh = self._vocab * h
        ops.append(
            (2.0 * shape.num_logits * vh, vh * db + shape.num_logits * self._vocab * LOGITS_BYTES)
        )
        return ops

    def attention_parts(self, shape: BatchShape) -> tuple[tuple[float, float], tuple[float, float]]:
        """The attention operator's (FLOPs, bytes) split into decode rows and prefill rows."""
        shape = self._local(shape)
        db, L = self.dtype_bytes, self._L
        decode_rows = shape.num_reqs - shape.num_prefill_reqs + shape.num_draft_tokens
        prefill_rows = shape.num_tokens - decode_rows
        qo = 2 * self._q_size * db * L  # q read and o written, per row
        kd = shape.decode_keys
        return (
            (self._attn_flops_per_pair * kd, kd * self._kv_bytes_per_token + decode_rows * qo),
            (
                self._attn_flops_per_pair * (shape.attn_key_pairs - kd),
                (shape.attn_keys_read - kd) * self._kv_bytes_per_token + prefill_rows * qo,
            ),
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

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to copy ``num_blocks`` KV blocks one way between GPU and host memory, at the
        GPU's host bandwidth (PCIe or C2C). Not overlapped with the forward: the copies must
        land before it reads the blocks. Not counted in the HBM bytes (another link)."""
        if not self._host_bandwidth or num_blocks == 0:
            return 0.0
        return num_blocks * block_size * self._kv_bytes_per_token / self._host_bandwidth


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
