"""The client's per-request cost, kept where the first round had it (issue 30): what a run does
for every network read of every request, and the garbage collector's reach during a run.

results/loadgen_capacity.md measures it side by side (tests/bench/bench_loadgen.py --against
REV); these tests pin the two causes that measurement found, without timing anything:
- every coroutine between a request's task and the socket is resumed on each read of its stream:
  a single request's chain is task -> _exchange -> send_request -> exchange (three of cbbench's
  coroutines, as 6a0ec45 had: _one -> _within -> _exchange; it had grown to six);
- a run freezes the heap made before it (gc.freeze), so no collection during the run walks the
  modules and the workload, and thaws it at the end; a caller's own freeze is left alone.
"""

from __future__ import annotations

import gc
import inspect
import sys
from pathlib import Path

import pytest
from fake_openai import endpoint_options, prompt_requests

from cbbench.load.cancel import CancelPlan
from cbbench.load.delays import parse_delay
from cbbench.targets import sse
from cbbench.targets.http import run_http

FIRST_ROUND_DEPTH = 3  # 6a0ec45: _one -> _within -> _exchange


def _cbbench_chain() -> list[str]:
    """The names of cbbench's coroutines on the stack of the running task, outermost first
    (each is resumed when the task is)."""
    names = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_flags & inspect.CO_COROUTINE and "cbbench" in code.co_filename:
            names.append(code.co_name)
        frame = frame.f_back
    return names[::-1]


def _chains_seen_by_feed(monkeypatch) -> list[list[str]]:
    chains: list[list[str]] = []
    feed = sse.SseStream.feed

    def spy(self, piece, t):
        chains.append(_cbbench_chain())
        return feed(self, piece, t)

    monkeypatch.setattr(sse.SseStream, "feed", spy)
    return chains


def test_each_stream_read_resumes_three_coroutines(fresh_fake_server, monkeypatch):
    chains = _chains_seen_by_feed(monkeypatch)
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests([f"hello {i}" for i in range(5)]), [0.0] * 5)
    assert all(r.error is None for r in run.records)
    assert chains, "the stream was never read"
    assert {tuple(c) for c in chains} == {("_exchange", "send_request", "exchange")}
    assert len(chains[0]) == FIRST_ROUND_DEPTH


def test_a_cancellable_request_takes_the_deeper_path_only_when_picked(fresh_fake_server, monkeypatch):
    """--cancel-rate's wrapper (a task of its own, cut at the cancel time) is on the path of the
    requests it picked; the others keep the short one."""
    chains = _chains_seen_by_feed(monkeypatch)
    plan = CancelPlan(0.5, parse_delay("10000", "--cancel-after"), seed=0)
    n = 12
    picked = sum(plan.cancel_after_s(i) is not None for i in range(n))
    assert 0 < picked < n  # the premise: some picked, some not
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests([f"hi {i}" for i in range(n)]), [0.0] * n,
                   cancel=plan)
    assert all(r.error is None and not r.cancelled for r in run.records)  # 10 s: none cut
    # A picked request's stream is read in a task of its own: the chain there starts below.
    assert {tuple(c) for c in chains} == {
        ("_exchange", "send_request", "exchange"), ("send_request", "exchange")
    }


def test_the_run_freezes_the_heap_from_before_it_and_thaws_it(fresh_fake_server):
    assert gc.get_freeze_count() == 0
    seen: list[int] = []
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests([f"x {i}" for i in range(4)]), [0.0] * 4,
                   on_progress=lambda done, total: seen.append(gc.get_freeze_count()))
    assert all(r.error is None for r in run.records)
    assert seen and min(seen) > 0  # frozen for the whole run
    assert gc.get_freeze_count() == 0  # and thawed after it


def test_a_callers_frozen_heap_is_left_alone(fresh_fake_server):
    gc.freeze()
    try:
        seen: list[int] = []
        run_http(endpoint_options(fresh_fake_server.url), prompt_requests(["y"]), [0.0],
                 on_progress=lambda done, total: seen.append(gc.get_freeze_count()))
        assert seen and min(seen) > 0
        # Not unfrozen by the run (the count only falls as frozen objects are freed).
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_side_by_side_bench_holds_the_client_to_the_server_log():
    """bench_loadgen_ab.figures: TTFT error = the client's TTFT (from the intended start) minus
    the server's (received -> first token written), per request; send lag and rate from sends."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_loadgen_ab import figures

    recs = [  # run-clock seconds; the server's clock differs by any offset (differences only)
        {"id": 0, "intended": 0.0, "send": 0.001, "first": 0.153, "ok": True, "error_type": None},
        {"id": 1, "intended": 0.01, "send": 0.014, "first": 0.170, "ok": True, "error_type": None},
        {"id": 2, "intended": 0.02, "send": 0.021, "first": None, "ok": False,
         "error_type": "timeout"},
    ]
    log = {"t-0": {"received": 100.0015, "first_token": 100.1515},
           "t-1": {"received": 100.0145, "first_token": 100.1645}}
    out = {"records": recs, "cpu_s": 0.3, "wall_s": 1.0, "window": None,
           "loop_lag_p99_ms": None, "client_fell_behind": False,
           "gc": {"collections": 0, "pause_total_ms": 0.0, "pause_max_ms": 0.0}}
    fig = figures(out, log, "t", 3)
    # request 0: client 153 ms, server 150 ms -> 3 ms; request 1: 160 - 150 -> 10 ms
    assert fig["ttft_err_p50_ms"] == pytest.approx(6.5)
    assert fig["ttft_err_p99_ms"] == pytest.approx(3 + 0.99 * 7)
    assert fig["send_lag_p50_ms"] == pytest.approx(1.0)  # lags 1, 4, 1 ms
    assert fig["achieved_send_rate"] == pytest.approx(2 / 0.020)
    assert (fig["completed"], fig["failed"], fig["error_types"]) == (2, 1, ["timeout"])
    assert fig["client_cpu_cores"] == pytest.approx(0.3)
