"""The fastest a GPU can run a step: the roofline at 100% of its spec's peaks, with no overhead.

No kernel streams HBM faster than the datasheet's peak bandwidth or multiplies faster than its
dense peak, so a step's time on that GPU is at least the simulator's roofline with every rate
at its peak, every attention efficiency 1 and every overhead 0. A device profile that predicts
a step below this floor describes no such device: calibrate's bounded fit keeps each rate
inside the physics, but a host factor below 1 scales the whole step down past them (a trace
recorded 1.5x faster than an H100 can run gave a profile whose batch-1 decode beat the H100's
floor by 30%, with no warning).

The peak FLOP rate is the spec's dense figure for the run's dtype (GPUSpec.peak_flops: the
bf16 tensor-core peak for bf16/fp16, the FP32 peak for fp32); for fp32 on a part with no listed
FP32 figure it is the bf16 peak, a lower floor than the true one, which is still a floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..model_config import ModelConfig
from .cost_model import BatchShape, CostModel, DeviceRates
from .gpu_specs import GPUSpec

# A predicted step may sit this far (relative) under the floor and still be on it: a profile
# at the bounds reproduces the floor up to rounding.
FLOOR_RTOL = 1e-6


def peak_rates(gpu: GPUSpec, dtype: str) -> DeviceRates:
    """``gpu`` at 100% of its peaks for ``dtype``: efficiencies 1, no overhead, no host factor."""
    return DeviceRates(memory_bandwidth=gpu.hbm_bandwidth,
                       flop_rate=gpu.peak_flops(dtype) or gpu.bf16_flops)


def floor_time_s(model: ModelConfig, dtype: str, gpu: GPUSpec, shape: BatchShape) -> float:
    """The least time ``gpu`` can take for the step ``shape`` of ``model`` in ``dtype``."""
    t = CostModel(model, dtype, rates=peak_rates(gpu, dtype)).cost(shape).time_s
    assert t is not None  # rates given: the roofline prices every step
    return t


def reference_steps(context: int) -> dict[str, BatchShape]:
    """The steps a profile is checked on: one decode row at ``context`` tokens of history,
    and a ``context``-token prefill (the two ends of the roofline: weights, then FLOPs)."""
    c = context
    return {
        f"one decode step at a {c}-token context": BatchShape(1, 1, c + 1, c + 1, 1, 0, c + 1),
        f"a {c}-token prefill": BatchShape(c, 1, c * (c + 1) / 2, c, 1, 1, 0.0),
    }


@dataclass(frozen=True)
class FloorCheck:
    """One reference step: what ``rates`` predict for it, and the GPU's floor."""

    what: str
    model: str
    predicted_s: float
    floor_s: float

    @property
    def ratio(self) -> float:
        """Predicted over floor: below 1, faster than the GPU can run the step."""
        return self.predicted_s / self.floor_s


def reference_checks(rates: DeviceRates, gpu: GPUSpec, dtype: str,
                     models: Sequence[ModelConfig], context: int) -> list[FloorCheck]:
    """Each model's reference steps (reference_steps) under ``rates`` beside ``gpu``'s floor."""
    out = []
    for model in dict.fromkeys(models):
        cost = CostModel(model, dtype, rates=rates)
        for what, shape in reference_steps(context).items():
            t = cost.cost(shape).time_s
            assert t is not None
            out.append(FloorCheck(what, model.name, t, floor_time_s(model, dtype, gpu, shape)))
    return out
