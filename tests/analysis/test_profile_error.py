"""A device profile scored per step class on a recorded run (the seventh review, item 5)."""

from __future__ import annotations

import pytest
from synthetic_gpu_run import retimed, sim_shapes

from cbbench.analysis.profile_error import step_errors
from cbbench.engine.sim.cost_model import DeviceRates
from cbbench.engine.sim.device_profile import DeviceProfile

# An H100-like device (tests/analysis/test_calibrate_physics.py's).
LIKE_H100 = DeviceRates(memory_bandwidth=2.8e12, flop_rate=6e14, iteration_overhead_s=3e-4,
                        row_overhead_s=2e-5, decode_attention_efficiency=0.6,
                        prefill_attention_efficiency=0.5)


def _profile(rates: DeviceRates) -> DeviceProfile:
    return DeviceProfile("h100", "NVIDIA H100 80GB HBM3", "bf16", ("llama-3-8b",), rates)


def test_a_profile_is_scored_per_step_class_out_of_sample():
    """Run-level figures of a decode-heavy run hide a prefill misprediction (the H100 profile
    fitted on the continuous run predicted the static run within 1% and its prefill steps at
    +29%): step_errors gives each class's error apart."""
    run = retimed(sim_shapes(), LIKE_H100)
    exact = step_errors(_profile(LIKE_H100), run)
    for cls in ("decode", "mixed", "prefill"):
        assert exact[cls]["n"] > 0 and exact[cls]["p90"] == pytest.approx(0.0, abs=1e-9)
    slow_prefill = DeviceRates(**{**LIKE_H100.to_dict(), "flop_rate": 3e14})
    off = step_errors(_profile(slow_prefill), run)
    assert abs(off["decode"]["bias"]) < 0.01  # decode is memory-bound: unchanged
    assert off["prefill"]["bias"] > 0.3  # the FLOP rate halved: prefill much slower
