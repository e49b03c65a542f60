"""A stopped endpoint run (Ctrl-C, SIGTERM: should_stop turns true) sends nothing more: the
requests in flight finish within the grace period and the rest are not_sent (docs/
reliability.md; the run's own "SIGINT: stopping; finishing in-flight requests"), as the
in-process engines do. That holds for a request waiting for a --max-concurrency slot and for
a session's next turn, whose think time ends at the stop, not after it.

The stop is the test's own: should_stop reads what the run has done (a turn's record ended,
the server has the first request), not a signal's timing."""

from __future__ import annotations

import json
import time

import numpy as np
from fake_openai import endpoint_options, prompt_requests
from helpers import run_spec

from cbbench.bench.runner import plan_schedule
from cbbench.targets.hooks import RunHooks
from cbbench.targets.http import run_http
from cbbench.targets.options import EndpointOptions

GRACE_S = 30.0  # long: a run that waited it out would show
THINK_S = 5.0  # each session's think time before its second turn


def test_a_session_in_its_think_time_sends_no_turn_after_the_stop(fake_server, tmp_path):
    """Two sessions of three turns; the stop comes once both first turns have ended, while
    both sessions sit in a 5 s think time (within the 30 s grace). Was: the run waited the
    think time out and sent both second turns (4 completed)."""
    fake_server.reset()
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"session_id": name, "turns": [
        {"user": "first", "output_len": 4},
        {"user": "second", "output_len": 4, "think_time_ms": THINK_S * 1000},
        {"user": "third", "output_len": 4, "think_time_ms": 100},
    ]}) + "\n" for name in ("a", "b")))
    spec = run_spec(workload=str(path), num_requests=None, think_time="0",
                    endpoint=EndpointOptions(endpoint=fake_server.url, api="chat",
                                             request_timeout_s=60.0))
    sched = plan_schedule(spec)
    ended: list = []
    t = time.perf_counter()
    run = run_http(
        spec.endpoint, sched.wreqs, sched.arrivals, should_stop=lambda: len(ended) >= 2,
        grace_s=GRACE_S, hooks=RunHooks(on_record=lambda pos, rec, method: ended.append(rec)),
        sessions=sched.plan,
    )
    took = time.perf_counter() - t
    assert run.interrupted
    assert sorted((r.session_id, r.turn) for r in run.records) == [("a", 1), ("b", 1)]
    assert all(r.ok for r in run.records)
    assert run.not_sent == 4
    assert len([q for q in fake_server.requests if q["path"] == "/v1/chat/completions"]) == 2
    # The sleeping sessions woke on the stop: neither the think time nor the grace waited out.
    assert took < THINK_S, took
    assert run.sessions_ended_early == 0  # stopped, not cut short by a failed turn


def test_requests_waiting_for_a_slot_are_not_sent_after_the_stop(fake_server):
    """--max-concurrency 1, four requests at t=0; the stop comes while the first is in flight
    (the server has it; it streams 20 tokens 0.1 s apart). Was: the other three were sent one
    after another once the slot was free (4 completed, not_sent 0)."""
    fake_server.reset()
    wreqs = prompt_requests(["delay:0.1"] + ["quick"] * 3, output_len=20)
    t = time.perf_counter()
    run = run_http(
        endpoint_options(fake_server.url, max_concurrency=1), wreqs, np.zeros(4),
        should_stop=lambda: len(fake_server.requests) >= 1, grace_s=GRACE_S,
    )
    assert run.interrupted
    assert [r.id for r in run.records] == [0]
    assert run.records[0].ok and run.records[0].output_tokens == 20
    assert run.not_sent == 3
    assert len([q for q in fake_server.requests if q["path"] == "/v1/completions"]) == 1
    assert time.perf_counter() - t < GRACE_S
