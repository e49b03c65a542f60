"""summary.intervals: a simulated run with a calibrated profile reports each headline figure
with the range its residual spread gives (engine/sim_bounds.py)."""

from __future__ import annotations

import json

import pytest
from helpers import run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.engine.sim.device_profile import load_profile
from cbbench.engine.sim.sim_bounds import spread_from_residuals
from cbbench.schema.run import Summary

RESIDUALS = {
    "decode": {"median": 0.05, "p90": 0.15, "n": 100, "bias": 0.05},
    "mixed": {"median": 0.1, "p90": 0.2, "n": 10, "bias": -0.1},
    "prefill": {"median": None, "p90": None, "n": 0, "bias": None},
}


def _profile(tmp_path, **extra) -> str:
    """A CPU-like profile: rates only (no spec), fitted on the 'small' preset."""
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({
        "kind": "cbbench-device-profile", "version": 1, "device": "cpu", "device_name": "cpu",
        "dtype": "fp32", "models": ["small"],
        "rates": {"memory_bandwidth": None, "flop_rate": 5e10, "iteration_overhead_s": 4e-4,
                  "row_overhead_s": 2e-5},
        **extra,
    }))
    return str(p)


def test_band_from_residuals_by_hand():
    """e in [bias - p90, bias + p90]; the step takes predicted / (1 + e)."""
    s = spread_from_residuals(RESIDUALS)
    assert s["decode"] == {"low": pytest.approx(1 / 1.2), "high": pytest.approx(1 / 0.9)}
    assert s["mixed"] == {"low": pytest.approx(1 / 1.1), "high": pytest.approx(1 / 0.7)}
    assert "prefill" not in s  # no steps of that class in the calibration run


def test_profile_spread_checked(tmp_path):
    assert load_profile(_profile(tmp_path)).spread is None
    explicit = {"decode": {"low": 0.9, "high": 1.2}}
    assert load_profile(_profile(tmp_path, spread=explicit)).spread == explicit
    with pytest.raises(ValueError, match="spread.decode"):
        load_profile(_profile(tmp_path, spread={"decode": {"low": 1.3, "high": 1.2}}))


def _run(profile: str | None, **kw) -> Summary:
    engine = EngineArgs(engine="sim", gpu_profile=profile, model="small", **kw)
    spec = run_spec(workload="sharegpt", num_requests=40, request_rate=20.0,
                   engine=engine)
    return execute_run(spec).summary


def test_intervals_bracket_the_point_and_scale_with_the_band(tmp_path):
    s = _run(_profile(tmp_path, residuals=RESIDUALS))
    iv = s.intervals  # an extra field: the dict the run wrote
    for key, stat in (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"),
                      ("tpot_ms", "p99")):
        band = iv[key][stat]
        assert band["level"] == 0.9
        assert band["low"] < getattr(getattr(s, key), stat) < band["high"], (key, stat)
    tp = iv["output_throughput"]
    assert tp["low"] < s.output_throughput < tp["high"]


def test_uniform_band_scales_every_figure_exactly(tmp_path):
    """All requests at t = 0 and one band for every class: the bound runs are the point run
    with every step 1/1.2 and 1/0.9 as long (same batches, same order), so each latency
    figure scales by exactly those factors and the throughput inversely."""
    same = {"median": 0.05, "p90": 0.15, "n": 100, "bias": 0.05}
    profile = _profile(tmp_path, residuals={c: same for c in ("decode", "mixed", "prefill")})
    engine = EngineArgs(engine="sim", gpu_profile=profile, model="small")
    spec = run_spec(workload="sharegpt", num_requests=30, engine=engine)
    s = execute_run(spec).summary
    iv = s.intervals
    for key in ("ttft_ms", "tpot_ms"):
        for stat in ("p50", "p99"):
            point = getattr(getattr(s, key), stat)
            assert iv[key][stat]["low"] == pytest.approx(point / 1.2, rel=1e-9)
            assert iv[key][stat]["high"] == pytest.approx(point / 0.9, rel=1e-9)
    assert iv["output_throughput"]["low"] == pytest.approx(s.output_throughput * 0.9)
    assert iv["output_throughput"]["high"] == pytest.approx(s.output_throughput * 1.2)


def test_no_profile_no_intervals(tmp_path):
    assert "intervals" not in (_run(None, gpu="h200").model_extra or {})
    # A profile without residuals:
    assert "intervals" not in (_run(_profile(tmp_path)).model_extra or {})
