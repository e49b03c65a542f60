"""predicted_s on every iteration record, and summary.engine.sim_error (issue 12 item 6).

The error statistics against a hand-computed case; the simulator's records carry their own
duration as the prediction; a real (torch, CPU) run has no prediction without a profile and
says why; with device rates it predicts every iteration and the summary reports the error per
class.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import run_spec

from cbbench.analysis.calibration import iteration_shape
from cbbench.analysis.comparison.sim_error import (
    NO_PREDICTION_REASON,
    SIMULATED_REASON,
    error_stats,
    iteration_class,
    sim_error,
)
from cbbench.bench.runner import RunSpec, execute_run
from cbbench.engine.args import EngineArgs
from cbbench.engine.sim.cost_model import CostModel, DeviceRates


def _quiet(_msg: str) -> None:
    pass


def it(prefill: int, decode: int, predicted: float | None, measured: float) -> dict:
    return {
        "num_prefill_tokens": prefill,
        "num_decode_tokens": decode,
        "predicted_s": predicted,
        "duration_s": measured,
    }


def test_iteration_classes():
    assert iteration_class(0, 5) == "decode"
    assert iteration_class(100, 5) == "mixed"
    assert iteration_class(100, 0) == "prefill"
    assert iteration_class(0, 0) is None  # a step that only copies KV blocks


def test_error_stats_by_hand():
    # decode errors: |1.1-1|/1 = 0.1, |0.8-1|/1 = 0.2, |3-2|/2 = 0.5 -> median 0.2,
    # p90 by linear interpolation: 0.2 + 0.8 * (0.5 - 0.2) = 0.44; signed: 0.1, -0.2, 0.5.
    iterations = [
        it(0, 4, 1.1, 1.0),
        it(0, 4, 0.8, 1.0),
        it(0, 4, 3.0, 2.0),
        it(512, 3, 0.5, 0.25),  # mixed: +1.0
        it(0, 0, 0.1, 0.2),  # no class: left out
        it(0, 2, None, 0.2),  # no prediction: left out
    ]
    stats, reason = sim_error(iterations, simulated=False)
    assert reason is None
    assert stats["decode"] == {
        "median": pytest.approx(0.2), "p90": pytest.approx(0.44), "n": 3,
        "bias": pytest.approx(0.1),
    }
    assert stats["mixed"] == {"median": 1.0, "p90": 1.0, "n": 1, "bias": 1.0}
    assert stats["prefill"] == {"median": None, "p90": None, "n": 0, "bias": None}


def test_error_stats_is_relative_to_the_measurement():
    s = error_stats(np.array([2.0]), np.array([4.0]), ["prefill"])
    assert s["prefill"]["median"] == 0.5 and s["prefill"]["bias"] == -0.5


def sim_spec(n: int = 40) -> RunSpec:
    return run_spec(
        workload="sharegpt", num_requests=n, request_rate=20.0,
        engine=EngineArgs(engine="sim", gpu="h100", model="llama-3-8b"),
    )


def test_every_simulated_record_predicts_its_own_duration():
    result = execute_run(sim_spec())
    its = result.iterations
    assert its
    for record in its:
        assert record.predicted_s == pytest.approx(record.duration_s, rel=1e-9)
        assert record.num_logits >= record.num_decode_tokens
        assert record.attn_key_pairs >= record.attn_keys_read > 0
        assert record.attn_keys_read >= record.attn_decode_keys
        if record.num_prefill_tokens == 0:  # a decode row reads every key it attends
            assert record.attn_decode_keys == record.attn_keys_read
        assert "replica" not in (record.model_extra or {})  # only data-parallel runs tag replicas
    assert result.summary.engine.sim_error is None
    assert result.summary.engine.sim_error_reason == SIMULATED_REASON


@pytest.fixture(scope="module")
def small_workload(tmp_path_factory):
    """Short requests, so the torch engine on a loaded 2-core CPU finishes in seconds: a
    burst of prefills, then decodes and mixed steps as later arrivals join."""
    import json

    path = tmp_path_factory.mktemp("wl") / "short.jsonl"
    rows = [{"prompt_len": 16 + 7 * i, "output_len": 4 + i % 5, "arrival_s": 0.02 * i}
            for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def torch_spec(workload: str, **engine) -> RunSpec:
    return run_spec(
        workload=workload, num_requests=None,
        engine=EngineArgs(engine="torch", model="tiny", device="cpu", max_model_len=1024,
                          **engine),
    )


def test_a_cpu_run_without_a_profile_has_null_predictions_and_says_why(small_workload):
    result = execute_run(torch_spec(small_workload))
    assert all(r.predicted_s is None for r in result.iterations)
    assert all(r.bytes_moved > 0 for r in result.iterations)  # still analytic figures
    eng = result.summary.engine
    assert eng.sim_error is None
    assert eng.sim_error_reason == NO_PREDICTION_REASON


def test_a_real_engine_with_device_rates_predicts_every_iteration(monkeypatch, small_workload):
    """The engine asks its cost model for a real executor's prediction; with rates (what a
    profile supplies) every record has one and the summary reports the error per class."""
    from cbbench.engine import build

    rates = DeviceRates(memory_bandwidth=5e9, flop_rate=2e10, iteration_overhead_s=1e-3,
                        row_overhead_s=1e-4)
    real_build = build.build_torch_engine

    def with_rates(args):
        engine, info = real_build(args)
        cm = engine.cost_model
        engine.cost_model = CostModel(cm.model, "fp32", rates=rates)
        return engine, info

    monkeypatch.setattr(build, "build_torch_engine", with_rates)
    result = execute_run(torch_spec(small_workload))
    cm = CostModel(_tiny(), "fp32", rates=rates)
    for record in result.iterations:
        assert record.predicted_s is not None and record.predicted_s > 0
        # The prediction is the roofline of the recorded shape (what calibrate refits).
        shape = iteration_shape(record)
        assert record.predicted_s == pytest.approx(cm.cost(shape).time_s, rel=1e-12)
    err = result.summary.engine.sim_error
    assert set(err) == {"decode", "mixed", "prefill"}
    n = sum(c["n"] for c in err.values())
    assert n == len(result.iterations)
    for c in err.values():
        if c["n"]:
            assert 0 <= c["median"] <= c["p90"]


def _tiny():
    from cbbench.engine.model_config import get_model_config

    return dataclasses.replace(get_model_config("tiny"), max_model_len=1024)
