"""An fp32 model is priced at the GPU's FP32 peak, not its bf16 tensor-core one: in the
simulator's roofline, in calibrate's physical bounds (roofline_physics.spec_priors) and in the
MFU a result reports. The truth is the vendors' datasheets (dense, non-sparse): an H100 SXM
does 989 TFLOP/s in bf16 on its tensor cores, 494.7 in TF32 (which PyTorch leaves off for
matmuls by default) and 67 TFLOP/s in FP32, the path fp32 GEMMs take. bf16 and fp16 keep
their figures bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cbbench.engine.model_config import MODEL_PRESETS
from cbbench.engine.sim.cost_model import BatchShape, CostModel, DeviceRates, Efficiency
from cbbench.engine.sim.gpu_specs import FP32_FLOPS, GPU_SPECS, get_gpu_spec

IDEAL = Efficiency(eta_memory=1.0, eta_compute=1.0, overhead_s=0.0)
H100_FP32 = 67e12
H100_BF16 = 989e12


def _prefill(n: int) -> BatchShape:
    """One request's whole n-token prompt in one step."""
    return BatchShape(n, 1, n * (n + 1) / 2, float(n), 1, 1, 0.0)


def test_fp32_prefill_is_priced_at_the_fp32_peak():
    """The reviewer's case: Llama-3.2-1B in fp32 on an H100, a 2048-token prefill step of
    4.26e12 FLOPs (2 x 2048 x ~1.24e9 GEMM params + attention + lm_head). At 100% of the FP32
    peak it takes at least 4.26e12 / 67e12 = 63.6 ms (was 8.73 ms at the simulator's 60% of
    the bf16 peak: 488 TFLOP/s, 7x the FP32 peak)."""
    m, gpu = MODEL_PRESETS["llama-3.2-1b"], get_gpu_spec("h100")
    c = CostModel(m, "fp32", gpu, IDEAL).cost(_prefill(2048))
    assert c.flops == pytest.approx(4.26e12, rel=0.01)
    assert c.time_s >= c.flops / H100_FP32  # >= 63.6 ms
    assert c.time_s >= 0.0636
    default = CostModel(m, "fp32", gpu).cost(_prefill(2048))
    assert default.time_s >= c.flops / (0.6 * H100_FP32)  # ~106 ms at the default 60%


def test_bf16_and_fp16_rates_are_unchanged():
    gpu = get_gpu_spec("h100")
    for dtype in ("bf16", "fp16"):
        r = DeviceRates.from_spec(gpu, Efficiency(), dtype)
        assert r.flop_rate == H100_BF16 * 0.6  # the same float as before
        assert gpu.peak_flops(dtype) == gpu.bf16_flops == H100_BF16
    assert DeviceRates.from_spec(gpu, Efficiency(), "fp32").flop_rate == H100_FP32 * 0.6


def test_every_gpu_has_an_fp32_peak_below_its_bf16_one():
    """Datasheet FP32 (non-tensor) figures: A100 19.5, L40S 91.6, H100 SXM 67, H100 PCIe 51,
    H200 67, HGX B200 75 TFLOP/s."""
    assert set(FP32_FLOPS) == set(GPU_SPECS)
    for name, spec in GPU_SPECS.items():
        assert spec.peak_flops("fp32") == FP32_FLOPS[name] < spec.bf16_flops
    assert FP32_FLOPS["h100"] == H100_FP32 and FP32_FLOPS["a100-80gb"] == 19.5e12


def test_calibrate_bounds_an_fp32_run_by_the_fp32_peak():
    """calibrate's FLOP-rate prior and bound (internal units: seconds per FLOP) for an fp32
    run: the bound 1/67e12 (no faster than the FP32 peak), the prior 60% of it."""
    from cbbench.engine.sim.roofline_fit import FitData
    from cbbench.engine.sim.roofline_physics import spec_priors

    one = np.ones(1)
    d = FitData(np.ones((1, 9)), np.ones((1, 9)), np.ones((1, 4)), one, one * 0, one * 0.01,
                ["decode"])
    gpu = get_gpu_spec("h100")
    fp32 = spec_priors(gpu, d, "fp32")[1]
    assert fp32.low == 1 / H100_FP32 and math.isclose(fp32.mean, 1 / (0.6 * H100_FP32))
    assert "fp32 peak 67 TFLOP/s" in fp32.basis
    assert spec_priors(gpu, d)[1].low == 1 / H100_BF16  # bf16 as before


def test_mfu_of_an_fp32_run_is_against_the_fp32_peak():
    """A whole fp32 run: summary.engine.mfu is its FLOPs over its busy time over 67 TFLOP/s,
    and no step reads above 100% (each step's time is at least its FLOPs at the FP32 peak
    over the 60% efficiency)."""
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    spec = run_spec(workload="random", input_len=2048, output_len=2, num_requests=8,
                    length_range=0.0, request_rate=math.inf,
                    engine=EngineArgs(engine="sim", gpu="h100", model="llama-3.2-1b",
                                      dtype="fp32"))
    result = execute_run(spec)
    its = result.iterations
    busy = sum(it.duration_s for it in its)
    flops = sum(it.flops for it in its)
    assert result.summary.engine.mfu == pytest.approx(flops / busy / H100_FP32, rel=1e-9)
    assert 0 < result.summary.engine.mfu <= 0.6


def test_the_physics_floor_of_an_fp32_step_is_the_fp32_peaks():
    """calibrate's floor (engine/sim/physics_floor.py: the roofline at 100% of the spec's peaks)
    for an fp32 model is held to the FP32 peak: the same 2048-token prefill of Llama-3.2-1B
    (4.26e12 FLOPs) cannot take under 4.26e12 / 67e12 = 63.6 ms on an H100. At the bf16 peak
    the floor was 4.3 ms, so an fp32 profile 10x faster than the part passed as physical."""
    from cbbench.engine.sim.physics_floor import floor_time_s, peak_rates

    m, gpu = MODEL_PRESETS["llama-3.2-1b"], get_gpu_spec("h100")
    assert peak_rates(gpu, "fp32").flop_rate == H100_FP32
    assert peak_rates(gpu, "bf16").flop_rate == H100_BF16
    assert floor_time_s(m, "fp32", gpu, _prefill(2048)) >= 0.0636
    assert floor_time_s(m, "bf16", gpu, _prefill(2048)) < 0.0636 / 10
