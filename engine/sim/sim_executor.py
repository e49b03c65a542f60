"""The simulated GPU: predicts each iteration's time from the batch's composition.

No tensors, no torch: the roofline in cost_model.py gives the time, and the engine's clock
advances by it (virtually for benchmarks, in real time behind ``cbbench serve``). Swap
preemption's KV copies add their transfer time over the host link. With speculative decoding
the verify rows are costed like any query rows, and acceptance is drawn (spec_decode.py).
A multimodal request's vision encoder (Request.encoder_flops) runs in the step that schedules
its first prefill chunk after an admission, as vLLM runs the encoder for the placeholder tokens
it schedules: compute-bound, its FLOPs at the device's FLOP rate, added to that step.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.scheduler_output import BatchShape, ExecutorOutput, IterationCost, SchedulerOutput
from ..core.spec_decode import SimAcceptance
from ..model_config import DTYPE_BYTES, ModelConfig
from .cost_model import CostModel, kv_heads_per_gpu
from .gpu_specs import GPUSpec

# Memory the engine may use, as vLLM's --gpu-memory-utilization default.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
# Activations, CUDA graphs and allocator slack that are not KV cache (a profiled run on a real
# GPU measures this; 2 GiB is typical for 8B-class models at a 2048-token budget).
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * 1024**3


def sim_num_kv_blocks(
    model: ModelConfig,
    gpu: GPUSpec,
    block_size: int,
    dtype: str = "bf16",
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES,
    tensor_parallel_size: int = 1,
    expert_parallel_size: int = 1,
) -> int:
    """KV capacity from memory: N_max = (M - W) / k tokens, in whole blocks, where M is the
    memory given to the engine (less an activation reserve), W the weights, k the KV bytes per
    token. With tensor parallelism all three are per GPU: each holds 1/tp of the weights and
    of the KV heads (whole heads: replicated when there are fewer KV heads than GPUs), and
    a block spans the GPUs, so the tightest GPU decides. With expert parallelism (ep GPUs)
    each holds every non-expert weight and 1/ep of the experts, and its own requests' KV:
    the pool is ep GPUs' worth."""
    tp, ep = tensor_parallel_size, expert_parallel_size
    usable = gpu.memory_bytes * gpu_memory_utilization - activation_reserve_bytes
    total = model.weight_bytes(dtype)
    experts = model.expert_params * model.expert_bytes_per_param(dtype)
    weights = (total - experts) / tp + experts / (tp * ep)
    free = usable - weights
    if free <= 0:
        where = (f"{gpu.name}'s memory" if tp == 1 and ep == 1
                 else f"{tp} x {gpu.name} (tensor parallel)" if ep == 1
                 else f"{ep} x {gpu.name} (expert parallel)")
        raise ValueError(
            f"{model.name} ({total / 1e9:.1f} GB in {dtype}) "
            f"does not fit in {where} at utilization {gpu_memory_utilization}"
        )
    # Every layer's KV for every token, sliding-window layers included. That stays
    # conservative for a model with them: vLLM's hybrid allocator gives a windowed layer only
    # the blocks its window spans (~window + one block per request), so on gpt-oss (12 of 24
    # layers windowed at 128 tokens) a long-context request holds about half the KV counted
    # here, and the real pool holds up to ~2x the tokens. The block manager keeps one block
    # table per request for all layers; a per-layer-type pool is a larger change.
    kv_per_token = 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim
    tokens = int(free // (kv_per_token * DTYPE_BYTES[dtype]))
    return ep * tokens // block_size


class SimExecutor:
    def __init__(
        self,
        cost_model: CostModel,
        block_size: int = 16,
        acceptance: SimAcceptance | None = None,
    ) -> None:
        """``acceptance``: speculative decoding's verification (how many drafts each decode
        keeps); needed when the engine drafts."""
        if cost_model.rates is None:
            raise ValueError("the simulated executor needs a GPU spec or a device profile")
        self.cost_model = cost_model
        self.block_size = block_size
        self.acceptance = acceptance

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        cost = self.cost_model.step_cost(sched, self.block_size)
        encoder = encoder_flops(sched)
        if encoder:
            rates = self.cost_model.rates
            assert rates is not None  # checked when the executor was made
            rate = rates.flop_rate
            extra_s = encoder / rate if rate else 0.0
            cost = replace(cost, flops=cost.flops + encoder,
                           time_s=cost.time_s + extra_s if cost.time_s is not None else None)
        swap_s = 0.0
        if sched.swap_out or sched.swap_in:
            swap_s = self.cost_model.swap_time(
                len(sched.swap_out) + len(sched.swap_in), self.block_size
            )
        accepted = None
        if sched.num_drafts:
            # The verify rows are in the cost above whatever is accepted: the forward computes
            # every row. Then each decode keeps a drawn number of its drafts.
            assert self.acceptance is not None, "drafts are proposed only with an acceptance model"
            draw = self.acceptance.accepted
            reqs = sched.scheduled_reqs
            accepted = [0] * len(reqs)
            for i in range(sched.num_decode_reqs):
                d = len(reqs[i].spec_token_ids)
                if d:
                    accepted[i] = draw(d)
        return ExecutorOutput(None, duration_s=cost.time_s, swap_time_s=swap_s, cost=cost,
                              num_accepted=accepted)

    # ---- the closed form of a step of decodes alone (core/engine.DecodeCostModel) ----------
    def decode_cost(self, num_rows: int, decode_keys: float) -> IterationCost:
        """What ``execute`` gives a step of ``num_rows`` decodes alone that read
        ``decode_keys`` keys: such a step has no encoder, swap or drafts."""
        return self.cost_model.cost(BatchShape.decodes(num_rows, decode_keys))

    def min_step_s(self) -> float | None:
        return self.cost_model.min_step_s()


def encoder_flops(sched: SchedulerOutput) -> float:
    """The vision-encoder FLOPs of this step: those of the prefill requests starting their
    first chunk since their admission (computed tokens = the prefix cache's hits at that
    admission)."""
    reqs = sched.scheduled_reqs
    total = 0.0
    for i in range(sched.num_decode_reqs, len(reqs)):
        r = reqs[i]
        if r.encoder_flops and r.num_computed_tokens == r.num_computed_at_admission:
            total += r.encoder_flops
    return total
