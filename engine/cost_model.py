"""Analytic bytes and FLOPs of one engine iteration, per operator, and a roofline time.

Used twice: the simulated executor predicts an iteration's time from it, and every engine
(simulated or real) records the analytic bytes/FLOPs per iteration so achieved bandwidth and
MBU/MFU can be reported. Formulas (per iteration, summed over layers):

- GEMMs (qkv, o, gate_up, down, lm_head): 2 * tokens * params FLOPs; bytes = the weights once
  plus input and output activations. lm_head runs only on rows that sample.
- Attention: 4 * q_heads * head_dim FLOPs per (query, key) pair (QK^T and PV); bytes = every key
  and value the rows read from the cache (a decode row reads its whole history; a prefill chunk
  reads its context once and its own keys) plus q and o.
- KV write: kv_bytes_per_token per new token.
- Elementwise (norms, rope, residuals, SiLU*mul) and embedding rows: memory-bound bytes.

Each operator's time is max(FLOPs / (peak_flops * eta_compute), bytes / (peak_bw * eta_memory));
the iteration adds a fixed overhead (launches, scheduling, sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu_specs import GPUSpec
from .model_config import DTYPE_BYTES, ModelConfig
from .scheduler_output import SchedulerOutput

# Efficiency defaults: what well-tuned kernels typically reach on Hopper-class GPUs
# (memory-bound GEMV/attention ~80% of peak HBM bandwidth, large GEMMs ~60% of dense peak).
# They are configurable and can be fitted from measurements on a real GPU.
DEFAULT_ETA_MEMORY = 0.80
DEFAULT_ETA_COMPUTE = 0.60
# CPU/launch overhead per iteration with CUDA graphs for decode; not overlapped in this model.
DEFAULT_ITERATION_OVERHEAD_S = 300e-6
# Elementwise passes over the hidden state per layer (2 RMSNorms, 2 residual adds, rope, act).
ELEMENTWISE_PASSES_PER_LAYER = 8
LOGITS_BYTES = 4  # fp32 logits


@dataclass(frozen=True)
class Efficiency:
    eta_memory: float = DEFAULT_ETA_MEMORY
    eta_compute: float = DEFAULT_ETA_COMPUTE
    overhead_s: float = DEFAULT_ITERATION_OVERHEAD_S


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What the cost depends on: token counts and attention work, not request identities."""

    num_tokens: int
    num_logits: int  # rows that sample
    attn_key_pairs: float  # sum over rows of keys attended
    attn_keys_read: float  # keys read from the cache, summed over requests

    @staticmethod
    def from_scheduler_output(sched: SchedulerOutput) -> BatchShape:
        reqs = sched.scheduled_reqs
        nd = sched.num_decode_reqs
        # A decode row with c computed tokens attends c + 1 keys and reads them all.
        dec_keys = sum([r.num_computed_tokens for r in reqs[:nd]]) + nd
        pairs = float(dec_keys)
        keys_read = float(dec_keys)
        num_logits = nd
        nums = sched.num_scheduled_tokens
        for i in range(nd, len(reqs)):
            r = reqs[i]
            n = nums[i]
            c = r.num_computed_tokens
            pairs += n * c + n * (n + 1) / 2
            keys_read += c + n
            if c + n == r.num_tokens:
                num_logits += 1
        return BatchShape(sched.total_tokens, num_logits, pairs, keys_read)


@dataclass(frozen=True, slots=True)
class IterationCost:
    bytes: float
    flops: float
    time_s: float  # roofline prediction on the given GPU, overhead included


class CostModel:
    def __init__(
        self,
        model: ModelConfig,
        dtype: str = "bf16",
        gpu: GPUSpec | None = None,
        efficiency: Efficiency = Efficiency(),
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.eff = efficiency
        db = DTYPE_BYTES[dtype]
        self.dtype_bytes = db
        m = model
        h, q, kv, inter, L = m.hidden_size, m.q_size, m.kv_size, m.intermediate_size, m.num_layers
        # (weight params, input width, output width) per GEMM per layer
        self._layer_gemms = [
            (h * (q + 2 * kv), h, q + 2 * kv),
            (q * h, q, h),
            (h * 2 * inter, h, 2 * inter),
            (inter * h, inter, h),
        ]
        self._L = L
        self._kv_bytes_per_token = m.kv_bytes_per_token(dtype)
        self._kv_bytes_per_token_layer = self._kv_bytes_per_token / L
        self._attn_flops_per_pair = 4 * m.num_heads * m.head_dim * L
        if gpu is not None:
            self._bw = gpu.hbm_bandwidth * efficiency.eta_memory
            self._fl = gpu.bf16_flops * efficiency.eta_compute

    def weight_bytes(self) -> float:
        return float(self.model.num_params * self.dtype_bytes)

    def cost(self, shape: BatchShape) -> IterationCost:
        db, L, T = self.dtype_bytes, self._L, shape.num_tokens
        m = self.model
        ops: list[tuple[float, float]] = []  # (flops, bytes) per operator, all layers
        for params, din, dout in self._layer_gemms:
            ops.append((2.0 * T * params * L, (params + T * (din + dout)) * db * L))
        ops.append(
            (
                self._attn_flops_per_pair * shape.attn_key_pairs,
                shape.attn_keys_read * self._kv_bytes_per_token
                + 2 * T * m.q_size * db * L,
            )
        )
        ops.append((0.0, T * self._kv_bytes_per_token))  # KV write
        ops.append((0.0, ELEMENTWISE_PASSES_PER_LAYER * T * m.hidden_size * db * L))
        ops.append((0.0, T * m.hidden_size * db))  # embedding rows
        vh = m.vocab_size * m.hidden_size
        ops.append(
            (2.0 * shape.num_logits * vh, vh * db + shape.num_logits * m.vocab_size * LOGITS_BYTES)
        )
        total_flops = sum(f for f, _ in ops)
        total_bytes = sum(b for _, b in ops)
        time_s = 0.0
        if self.gpu is not None:
            bw, fl = self._bw, self._fl
            time_s = sum(max(f / fl, b / bw) for f, b in ops) + self.eff.overhead_s
        return IterationCost(total_bytes, total_flops, time_s)

    def iteration_cost(self, sched: SchedulerOutput) -> IterationCost:
        return self.cost(BatchShape.from_scheduler_output(sched))

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to copy ``num_blocks`` KV blocks one way between GPU and host memory, at the
        GPU's host bandwidth (PCIe or C2C). Not overlapped with the forward: the copies must
        land before it reads the blocks. Not counted in the HBM bytes (another link)."""
        if self.gpu is None or num_blocks == 0:
            return 0.0
        return num_blocks * block_size * self._kv_bytes_per_token / self.gpu.host_bandwidth
