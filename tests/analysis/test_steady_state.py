"""Steady-state windows: detection from the running-request count (hand-made step functions),
--warmup/--cooldown, the figures inside a window (hand-computed), and the window on every
result, engine and endpoint alike."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_spec
from typer.testing import CliRunner

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.columns import request_columns
from cbbench.analysis.summary.metrics import ENGINE_FIELDS, engine_columns
from cbbench.analysis.summary.steady_state import (
    METHOD_IN_FLIGHT,
    METHOD_RUNNING,
    METHOD_WARMUP,
    detect_window,
    steady_state,
    steps_from_iterations,
    steps_from_requests,
    window_figures,
)
from cbbench.bench.runner import execute_run
from cbbench.cli.app import app
from cbbench.engine.args import EngineArgs

SIM = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b")


def _rec(i, start, tokens, prompt=10, **kw) -> RequestRecord:
    return RequestRecord(id=i, prompt_tokens=prompt, output_tokens=len(tokens),
                         intended_start_s=start, send_s=start, token_times_s=list(tokens), **kw)


# ---- detection ------------------------------------------------------------------------------
def test_ramp_plateau_drain_all_arriving_at_once():
    # c(t): 0 on [0,1), 5 on [1,2), 10 on [2,8), 5 on [8,9), 0 on [9,10)
    edges = np.array([0, 1, 2, 8, 9, 10], dtype=float)
    values = np.array([0, 5, 10, 5, 0], dtype=float)
    start, end, detail = detect_window(edges, values, 0.0, 0.0)
    assert (start, end) == (2.0, 8.0)
    assert detail["level"] == 10.0 and detail["threshold"] == 9.0


def test_the_window_closes_at_the_last_arrival():
    edges = np.array([0, 1, 2, 8, 9, 10], dtype=float)
    values = np.array([0, 5, 10, 5, 0], dtype=float)
    start, end, _ = detect_window(edges, values, 0.0, 6.5)
    assert (start, end) == (2.0, 6.5)


def test_the_level_is_the_median_while_requests_arrive():
    # A long drain at a lower count must not pull the level down: arrivals end at 6.
    edges = np.array([0, 1, 6, 20], dtype=float)
    values = np.array([2, 8, 3], dtype=float)
    start, end, detail = detect_window(edges, values, 0.0, 6.0)
    assert detail["level"] == 8.0 and (start, end) == (1.0, 6.0)


def test_idle_run_has_no_window():
    assert detect_window(np.array([0.0, 1.0]), np.array([0.0]), 0.0, 0.0) is None


def test_step_functions_from_iterations_and_records():
    its = [{"start_s": 0.0, "duration_s": 1.0, "num_running": 2},
           {"start_s": 1.0, "duration_s": 1.0, "num_running": 4},
           {"start_s": 3.0, "duration_s": 1.0, "num_running": 1}]  # idle on [2, 3)
    edges, values = steps_from_iterations(
        {k: np.array([it[k] for it in its]) for k in ("start_s", "duration_s", "num_running")})
    assert edges.tolist() == [0, 1, 2, 3, 4] and values.tolist() == [2, 4, 0, 1]
    recs = [_rec(0, 0.0, [1.0, 2.0]), _rec(1, 0.5, [1.5]), _rec(2, 2.0, [3.0])]
    edges, values = steps_from_requests(request_columns(recs))
    # sends 0, 0.5, 2.0; ends 1.5, 2.0, 3.0 (an end and a send at 2.0: the end first)
    assert edges.tolist() == [0, 0, 0.5, 1.5, 2.0, 2.0, 3.0]
    assert values.tolist() == [0, 1, 2, 1, 0, 1]


# Two engines' iterations, in the order the set records them (by start). Replica 0: 2 running
# on [0, 1), 4 on [1, 2), idle on [2, 3), 1 on [3, 4). Replica 1: idle on [0, 0.5), 3 on
# [0.5, 1.5), 5 on [1.5, 3.5).
TWO_ENGINES = [(0, 0.0, 1.0, 2), (1, 0.5, 1.0, 3), (0, 1.0, 1.0, 4), (1, 1.5, 2.0, 5),
               (0, 3.0, 1.0, 1)]
# Their sum: 2 + 0, 2 + 3, 4 + 3, 4 + 5, 0 + 5, 1 + 5, 1 + 0.
SUMMED_EDGES = [0, 0.5, 1, 1.5, 2, 3, 3.5, 4]
SUMMED_VALUES = [2, 5, 7, 9, 5, 6, 1]


def _its(label: str, names: list) -> list[dict]:
    return [{"start_s": t, "duration_s": d, "num_running": n, label: names[k]}
            for k, t, d, n in TWO_ENGINES]


@pytest.mark.parametrize("label,names", [("replica", [0, 1]), ("pool", ["prefill", "decode"])])
def test_several_engines_count_the_sum_of_their_running_requests(label, names):
    """--data-parallel-size / --disaggregate: each engine's own step function, summed. Sorting
    all iterations into one step function counted whichever engine had last started one:
    2, 3, 4, 5, 1 here, where the deployment ran 2, 5, 7, 9, 5, 6, 1."""
    its = _its(label, names)
    cols = {k: np.array([it[k] for it in its]) for k in ("start_s", "duration_s", "num_running",
                                                         label)}
    edges, values = steps_from_iterations(cols)
    assert edges.tolist() == SUMMED_EDGES and values.tolist() == SUMMED_VALUES
    # The same from the result's iteration dicts (the columns the run's summary reads).
    full = [{**it, **{f: 0 for f in ENGINE_FIELDS if f not in it}} for it in its]
    edges, values = steps_from_iterations(engine_columns(full))
    assert edges.tolist() == SUMMED_EDGES and values.tolist() == SUMMED_VALUES
    # The level: the time-weighted median over [0, 4): 9 for 0.5 s, 7 for 0.5 s, 6 for 0.5 s,
    # 5 for 1.5 s (cumulative 3.0 of 4.0 from the top: the median is 5); the window opens at
    # 0.5 (first >= 4.5) and closes at 3.5 (last >= 4.5).
    start, end, detail = detect_window(edges, values, 0.0, 0.0)
    assert detail["level"] == 5.0 and (start, end) == (0.5, 3.5)


def test_one_labelled_engine_is_the_unlabelled_step_function():
    its = [{"start_s": t, "duration_s": d, "num_running": n, "replica": 0, "pool": None}
           for _, t, d, n in TWO_ENGINES[::2]]
    base = {k: np.array([it[k] for it in its]) for k in ("start_s", "duration_s", "num_running")}
    labelled = {**base, "replica": np.zeros(3, dtype=int), "pool": np.array(["", "", ""])}
    for a, b in zip(steps_from_iterations(base), steps_from_iterations(labelled), strict=True):
        assert a.tolist() == b.tolist()
    assert steps_from_iterations(base)[1].tolist() == [2, 4, 0, 1]


def _in_flight_median(res: dict) -> float:
    """The client's requests in flight (send to end), time-weighted median over the arrivals,
    from the result's request records, sampled on a fine grid."""
    ok = [r for r in res["requests"] if r["error"] is None and not r["cancelled"]]
    start = np.array([r["intended_start_s"] for r in ok])
    send = start + np.array([r["send_lag_ms"] or 0.0 for r in ok]) / 1000
    end = start + np.array([r["e2el_ms"] for r in ok]) / 1000
    t = np.linspace(start.min(), start.max(), 20001)
    return float(np.median(((send <= t[:, None]) & (end > t[:, None])).sum(axis=1)))


@pytest.mark.parametrize("cluster", [["--data-parallel-size", "2"],
                                     ["--data-parallel-size", "3", "--router", "least-requests"]])
def test_a_data_parallel_runs_level_is_the_deployments(tmp_path, cluster):
    """Two replicas at 20 req/s held ~15 requests (the client's in-flight median); the level
    was one replica's count (~7)."""
    out = tmp_path / "dp.json"
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--quiet", "--num-requests", "150",
                                   "--request-rate", "20", *cluster, "--output", str(out)])
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    ss = result["summary"]["steady_state"]
    median = _in_flight_median(result)
    assert median >= 10 and abs(ss["level"] - median) <= 2, (ss["level"], median)
    assert f"the engine ran a steady ~{ss['level']:g} requests" in res.output


# ---- figures in a window ------------------------------------------------------------------------
def test_window_figures_by_hand():
    recs = [
        _rec(0, 0.0, [0.5, 1.5, 2.5]),  # served at 0.5: before the window
        _rec(1, 1.0, [1.2, 1.4, 2.0, 3.0]),  # served in [1, 3]
        _rec(2, 2.5, [2.6, 3.5]),  # served in the window; its last token after it
        _rec(3, 2.0, [], error="boom", error_type="http_status"),  # failed, started inside
    ]
    f = window_figures(recs, 1.0, 3.0)
    assert (f["requests"], f["completed"], f["failed"]) == (3, 2, 1)
    assert f["duration_s"] == 2.0
    # tokens streamed in [1, 3]: r0 1.5, 2.5; r1 all 4; r2 2.6 -> 7 tokens in 2 s
    assert f["output_throughput"] == pytest.approx(3.5)
    # completed in the window: r0 (2.5) and r1 (3.0) -> 1 req/s; prompts 20 + 7 tokens
    assert f["request_throughput"] == pytest.approx(1.0)
    assert f["total_token_throughput"] == pytest.approx((20 + 7) / 2)
    assert f["ttft_ms"]["count"] == 2
    assert f["ttft_ms"]["mean"] == pytest.approx((0.2 + 0.1) / 2 * 1000)


def _multi(i, start, times, counts, output_tokens, prompt=64) -> RequestRecord:
    """An HTTP request whose stream events carried ``counts`` tokens each."""
    return RequestRecord(id=i, prompt_tokens=prompt, output_tokens=output_tokens,
                         intended_start_s=start, send_s=start, token_times_s=list(times),
                         event_tokens=list(counts), output_tokens_method="usage")


def test_window_throughput_counts_tokens_not_stream_events():
    # Two HTTP requests of 10 output tokens each, streamed as events of 3, 3, 3, 1 tokens, all
    # inside [0, 2]: 20 tokens in 2 s = 10 tok/s (counting events gave 8 / 2 = 4 tok/s); with
    # the prompts (2 x 64, both finished inside) (128 + 20) / 2 = 74 tok/s.
    recs = [_multi(i, float(i), [i + 0.1, i + 0.2, i + 0.3, i + 0.4], [3, 3, 3, 1], 10)
            for i in range(2)]
    f = window_figures(recs, 0.0, 2.0)
    assert f["output_throughput"] == 10.0
    assert f["total_token_throughput"] == 74.0
    ss = steady_state(recs, 2.0, warmup_s=0.0, cooldown_s=0.0)  # the --warmup/--cooldown path
    assert ss["window_s"] == [0.0, 2.0]
    assert (ss["output_throughput"], ss["total_token_throughput"]) == (10.0, 74.0)


def test_window_cuts_a_stream_by_its_events_tokens_as_the_slices_do():
    from cbbench.analysis.summary.slices import time_slices

    recs = [
        # events of 3, 3, 3, 1 tokens; the window [1, 2] holds the 2nd and 3rd: 6 tokens
        _multi(0, 0.0, [0.5, 1.0, 1.5, 2.5], [3, 3, 3, 1], 10),
        # usage says 9 tokens, the events carried one each (one_per_event): the 6 the events
        # did not carry count at the last event (1.8, inside): 1 + 1 + 7 = 9 tokens
        _multi(1, 0.0, [0.2, 1.2, 1.8], [1, 1, 1], 9),
    ]
    # [1, 2]: 6 + (1 + 7) = 14 tokens in 1 s
    assert window_figures(recs, 1.0, 2.0)["output_throughput"] == 14.0
    # --slice 1 over [0, 3): the one rule, so the [1, 2) slice holds the same 14 tokens
    # (no event on 2.0), and the three slices hold the 19 the requests streamed.
    slices = time_slices(recs, 3.0, 1.0)
    assert [s["output_tokens"] for s in slices] == [3 + 1, 14, 1]


def test_warmup_and_cooldown_set_the_window():
    recs = [_rec(i, i * 1.0, [i + 0.1, i + 0.2]) for i in range(10)]
    ss = steady_state(recs, 10.0, warmup_s=2.0, cooldown_s=3.0)
    assert ss["window_s"] == [2.0, 7.0] and ss["method"] == METHOD_WARMUP
    assert ss["warmup_s"] == 2.0 and ss["cooldown_s"] == 3.0
    assert ss["requests"] == 5  # served at 2.1 ... 6.1
    empty = steady_state(recs, 10.0, warmup_s=8.0, cooldown_s=3.0)
    assert empty["window_s"] is None and "empty window" in empty["note"]


# ---- on every result ------------------------------------------------------------------------------
def test_engine_result_reports_both_windows():
    result = execute_run(run_spec(workload="sharegpt", num_requests=400, engine=SIM))
    s = result.summary
    ss = s.steady_state
    a, b = ss.window_s
    assert ss.method == METHOD_RUNNING and 0 < a < b < s.duration_s
    # Saturated: ramp-up and drain pull the whole-run rate down; the window is at full batch.
    assert ss.output_throughput > s.output_throughput
    assert ss.completed <= s.completed and ss.ttft_ms.count == ss.completed


def test_endpoint_result_uses_the_in_flight_count():
    from fake_openai import FakeOpenAI

    from cbbench.targets.options import EndpointOptions

    with FakeOpenAI() as fake:
        result = execute_run(run_spec(
            workload="sharegpt", num_requests=60, request_rate=200.0,
            endpoint=EndpointOptions(endpoint=fake.url, request_timeout_s=30.0),
        ))
    ss = result.summary.steady_state
    assert ss.method == METHOD_IN_FLIGHT and ss.window_s is not None
    last_arrival = max(r.intended_start_s for r in result.requests)
    assert ss.window_s[1] <= last_arrival + 1e-9


def test_cli_flags_and_table(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--num-requests", "200",
                                   "--request-rate", "20", "--warmup", "1", "--cooldown", "1",
                                   "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "steady state, 1.00-" in res.output and "(--warmup and --cooldown left out)" in res.output
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--warmup", "-1",
                                   "--output", str(out)])
    assert res.exit_code == 2 and "--warmup must be >= 0" in res.output
