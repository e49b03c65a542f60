"""The client's own health: the event-loop-lag heartbeat and its client-bound verdict, the
wall-clock instant of the schedule's zero, and summary.client_bound."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fake_openai import FakeOpenAI
from helpers import run_spec

from cbbench.analysis.table import CLIENT_BOUND_MARK, LATENCY_KEYS, latency_table
from cbbench.bench.runner import execute_run
from cbbench.targets.client_health import (
    CLIENT_BOUND_METRICS,
    LOOP_LAG_MIN_SPAN_S,
    ClientMonitor,
    client_bound_summary,
    loop_lag_check,
    wall_clock_of,
)
from cbbench.targets.options import EndpointOptions

STALL_S = 0.05
STALL_EVERY_S = 0.1


def test_verdict_limits_and_minimum_span():
    quiet = [0.6] * 990 + [3.0] * 10
    assert not loop_lag_check(quiet, 10.0)["client_bound"]
    slow_p50 = [2.5] * 1000
    assert loop_lag_check(slow_p50, 10.0)["client_bound"]
    stalls = [0.6] * 980 + [40.0] * 20  # p99 40 ms
    out = loop_lag_check(stalls, 10.0)
    assert out["client_bound"] and out["loop_lag_max_ms"] == 40.0
    assert "--workers" in out["client_bound_message"]
    # Too short a run to judge, however few or bad its samples.
    assert not loop_lag_check(stalls, LOOP_LAG_MIN_SPAN_S / 2)["client_bound"]
    # A loop stalled so badly that it woke only a few times over a long run is still judged.
    assert loop_lag_check([900.0, 1200.0, 0.5], 5.0)["client_bound"]
    assert loop_lag_check([], 5.0) == {
        "loop_lag_p50_ms": None,
        "loop_lag_p99_ms": None,
        "loop_lag_max_ms": None,
        "loop_lag_span_s": 5.0,
        "client_bound": False,
    }


def test_heartbeat_sees_a_loop_blocked_by_its_own_callbacks():
    """A loop that blocks 50 ms every 100 ms (as a client does that cannot keep up) is flagged;
    the stalls only grow on a loaded machine, so the verdict cannot flip."""

    async def main() -> dict:
        mon = ClientMonitor(time.perf_counter())
        beat = asyncio.create_task(mon.run())
        end = time.perf_counter() + LOOP_LAG_MIN_SPAN_S + 0.3
        while time.perf_counter() < end:
            await asyncio.sleep(STALL_EVERY_S)
            time.sleep(STALL_S)  # blocks the loop, as a CPU-bound callback would
        mon.stop()
        beat.cancel()
        return mon.result(time.perf_counter() - mon.t0)

    out = asyncio.run(main())
    assert out["client_bound"], out
    assert out["loop_lag_p99_ms"] >= 0.8 * STALL_S * 1000
    assert out["loop_lag_span_s"] >= LOOP_LAG_MIN_SPAN_S
    # The stalls sleep (no CPU): the process's CPU is its own small share of the time.
    assert 0 < out["client_cpu_s"] < out["loop_lag_span_s"]


def test_wall_clock_of_the_schedule_zero():
    t0 = time.perf_counter() - 2.0  # a zero two seconds ago
    epoch = wall_clock_of(t0)
    assert epoch == pytest.approx(time.time() - 2.0, abs=0.05)
    assert round(epoch, 6) == epoch  # microseconds


def test_client_bound_summary_names_the_figures_and_why():
    assert client_bound_summary({"client_bound": False, "client_fell_behind": False}) == {
        "metrics": [],
        "reasons": [],
    }
    behind = client_bound_summary(
        {"client_fell_behind": True, "client_fell_behind_message": "fell behind"}
    )
    assert behind == {"metrics": ["ttft_ms", "e2el_ms"], "reasons": ["fell behind"]}
    both = client_bound_summary(
        {
            "client_bound": True,
            "client_bound_message": "lagged",
            "client_fell_behind": True,
            "client_fell_behind_message": "fell behind",
        }
    )
    assert both["metrics"] == list(CLIENT_BOUND_METRICS) and len(both["reasons"]) == 2


def test_a_run_whose_loop_stalls_marks_its_latency_rows_in_the_table(tmp_path):
    """A real run against the fake server whose event loop is blocked STALL_S at every progress
    update (run_http calls on_progress from the loop, at most every 0.1 s, as a slow callback
    or a saturated client would stall it): TTFT/TPOT/ITL/E2EL are client-bound and starred."""
    n, rate = 30, 20.0  # 1.5 s: past LOOP_LAG_MIN_SPAN_S, so a verdict is given
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"delay:0.005 s{i}", "output_len": 4}) + "\n"
                            for i in range(n)))
    with FakeOpenAI() as fake:
        result = execute_run(
            run_spec(workload=str(path), num_requests=None, request_rate=rate,
                    endpoint=EndpointOptions(endpoint=fake.url, request_timeout_s=60.0)),
            on_progress=lambda done, total: time.sleep(STALL_S),
        )
    s = result.summary
    assert s.completed == n
    assert s.http["client_bound"] and s.http["loop_lag_p99_ms"] >= 0.8 * STALL_S * 1000
    assert s.client_bound.metrics == list(CLIENT_BOUND_METRICS)
    table = latency_table(s)
    for label, _key in LATENCY_KEYS:
        assert f"{label} (ms){CLIENT_BOUND_MARK}" in table
    footnote = table.splitlines()[-1]
    assert footnote.startswith("* client-bound: the client's event loop lagged")
    assert "--workers" in footnote
