"""--workers with multi-turn sessions and with --cancel-rate.

Sessions: each worker gets whole sessions (a turn carries its session's earlier replies), runs
them on the run's own plan (same request ids, labels and think times), and the merged result
equals a one-process run of the same seed in its counts: every turn once, by_turn and
summary.sessions alike. Cancellation: decided per request id, so every worker cancels its own
requests exactly as one process would. A dead worker's unreported turns are accounted for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import run_spec
from worker_runs import CLI, POLL_S, RUN_TIMEOUT_S, worker_pids

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.table import workers_table
from cbbench.bench.runner import execute_run
from cbbench.cli.run import WORKER_LOST_EXIT
from cbbench.distributed.merge import WORKER_LOST, Merger
from cbbench.distributed.messages import Done, Ready, RecordBatch
from cbbench.distributed.plan import LoadPlan
from cbbench.distributed.session_share import deal_sessions
from cbbench.load.cancel import CancelPlan
from cbbench.load.delays import parse_delay
from cbbench.load.session_plan import SessionPlan
from cbbench.load.sessions import Session, Turn, sample_sessions, sharegpt_multiturn
from cbbench.schema.run import RunResult, Summary
from cbbench.targets.options import EndpointOptions

SEED = 5
SESSIONS = 6
THINK = "exp:20"
THINK_SLACK_S = 2.0  # a loaded machine may start a turn late, never early
COUNT_KEYS = ("count", "started", "completed", "ended_early", "turns_planned", "turns_sent")


def _session_run(url: str, workers: int) -> RunResult:
    return execute_run(run_spec(
        workload="sharegpt-multiturn", num_requests=SESSIONS, request_rate=20.0,
        seed=SEED, think_time=THINK, load_plan=LoadPlan(workers),
        endpoint=EndpointOptions(endpoint=url, api="chat", request_timeout_s=60.0),
    ))


def _turn_counts(summary: Summary) -> list[tuple]:
    return [(t.turn, t.completed, t.failed, t.mean_prompt_tokens)
            for t in summary.by_turn or []]


def test_two_workers_run_whole_sessions_as_one_process_would(fake_server):
    one = _session_run(fake_server.url, 1)
    two = _session_run(fake_server.url, 2)
    assert two.config.workers == 2
    s1, s2 = one.summary, two.summary
    turns = s1.sessions.turns_planned
    assert turns > SESSIONS  # multi-turn sessions, not single requests
    for r in (one, two):  # every turn accounted exactly once
        assert sorted(q.id for q in r.requests) == list(range(turns))
        assert r.summary.completed == turns and r.summary.failed == 0
    assert _turn_counts(s2) == _turn_counts(s1)
    assert ({k: getattr(s2.sessions, k) for k in COUNT_KEYS}
            == {k: getattr(s1.sessions, k) for k in COUNT_KEYS})

    # Whole sessions, dealt in turn: session position i (its label) on worker i mod 2.
    owners: dict = {}
    for q in two.requests:
        owners.setdefault(q.session_id, set()).add(q.worker)
    assert owners == {i: {i % 2} for i in range(SESSIONS)}
    per_worker = {w.worker: w for w in s2.workers}
    for k in (0, 1):
        mine = sum(1 for q in two.requests if q.worker == k)
        assert per_worker[k].sent == per_worker[k].assigned == mine > 0
        assert per_worker[k].not_sent == 0 and per_worker[k].status == "done"

    # The same plan: turn 1 on the one-process schedule; each later turn one think time (drawn
    # per session position and turn) after its previous reply's last token.
    drawn, _ = sample_sessions(sharegpt_multiturn(), SESSIONS, SEED)
    plan = SessionPlan(drawn, np.zeros(SESSIONS), parse_delay(THINK, ""), SEED)
    firsts = {q.session_id: q.intended_start_s for q in one.requests if q.turn == 1}
    by_session: dict = {}
    for q in two.requests:
        by_session.setdefault(q.session_id, []).append(q)
    for i, recs in by_session.items():
        recs.sort(key=lambda q: q.turn)
        assert recs[0].intended_start_s == firsts[i]
        for prev, nxt in zip(recs, recs[1:]):
            ended = prev.intended_start_s + prev.e2el_ms / 1000
            think = plan.think_time_s(i, nxt.turn - 1)
            assert think - 1e-9 <= nxt.intended_start_s - ended < think + THINK_SLACK_S


def test_a_failed_turn_ends_its_session_on_its_worker(fake_server, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(
        json.dumps({"turns": [{"user": "fault:http500", "output_len": 2},
                              {"user": "never sent", "output_len": 2},
                              {"user": "nor this", "output_len": 2}]}) + "\n"
        + json.dumps({"turns": [{"user": "fine", "output_len": 2},
                                {"user": "still fine", "output_len": 2}]}) + "\n"
    )
    result = execute_run(run_spec(
        workload=str(path), num_requests=None, think_time="0", load_plan=LoadPlan(2),
        endpoint=EndpointOptions(endpoint=fake_server.url, api="chat", request_timeout_s=60.0),
    ))
    s = result.summary
    assert (s.completed, s.failed, s.not_sent) == (2, 1, 2)
    assert s.sessions.ended_early == 1 and s.sessions.completed == 1
    w0, w1 = s.workers
    assert (w0.assigned, w0.sent, w0.failed, w0.not_sent) == (3, 1, 1, 2)
    assert (w1.assigned, w1.sent, w1.completed, w1.not_sent) == (2, 2, 2, 0)


def test_two_workers_cancel_on_the_one_process_plan(fake_server, tmp_path):
    n, rate, after_ms = 24, 0.5, 30
    path = tmp_path / "slow.jsonl"  # 10 tokens 20 ms apart: every pick is cancelled in time
    path.write_text("".join(json.dumps({"prompt": f"delay:0.02 c{i}", "output_len": 10}) + "\n"
                            for i in range(n)))
    results = [execute_run(run_spec(
        workload=str(path), num_requests=None, request_rate=50.0, seed=SEED,
        endpoint=EndpointOptions(endpoint=fake_server.url, request_timeout_s=60.0),
        cancel_rate=rate, cancel_after=str(after_ms), load_plan=LoadPlan(w),
    )) for w in (1, 2)]
    plan = CancelPlan(rate, parse_delay(str(after_ms), ""), SEED)
    picked = {i for i in range(n) if plan.cancel_after_s(i) is not None}
    assert 0 < len(picked) < n
    for r in results:
        s = r.summary
        assert {q.id for q in r.requests if q.cancelled} == picked
        assert (s.cancelled, s.completed, s.failed) == (len(picked), n - len(picked), 0)
        assert sum(w.cancelled for w in s.workers) == len(picked)
        assert sum(w.sent for w in s.workers) == n
        assert all(w.not_sent == 0 for w in s.workers)
    assert [q.worker for q in results[1].requests] == [i % 2 for i in range(n)]
    head, _, *rows = workers_table(results[1].summary.workers).splitlines()
    cols = head.split()
    assert cols[3:7] == ["sent", "ok", "failed", "cancelled"]
    for row, w in zip(rows, results[1].summary.workers):
        assert row.split()[3:7] == [str(getattr(w, k)) for k in ("sent", "completed", "failed",
                                                         "cancelled")]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds workers through /proc")
def test_a_worker_killed_mid_session_is_accounted_turn_by_turn(fake_server, tmp_path):
    sessions, turns = 4, 6  # each turn ~0.15 s (5 tokens 30 ms apart), 50 ms think time
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"turns": [
        {"user": "delay:0.03 hello" if k == 0 else f"turn {k}", "output_len": 5}
        for k in range(turns)]}) + "\n" for _ in range(sessions)))
    out = tmp_path / "killed.json"
    fake_server.reset()
    proc = subprocess.Popen(CLI + [
        "run", "--endpoint", fake_server.url, "--api", "chat", "--workload", str(path),
        "--think-time", "50", "--request-rate", "20", "--workers", "2", "--output", str(out),
    ], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while sum(r["path"] == "/v1/chat/completions" for r in fake_server.requests) < 2 * sessions:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run did not get going"
            time.sleep(POLL_S)
        pids = worker_pids(proc.pid)
        assert len(pids) == 2, pids
        os.kill(pids[1], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == WORKER_LOST_EXIT, stderr
    r = json.loads(out.read_text())
    s = r["summary"]
    assert s["completed"] + s["failed"] + s["not_sent"] == sessions * turns
    w0, w1 = s["workers"]
    assert w0["status"] == "done" and w0["completed"] == w0["assigned"] == sessions // 2 * turns
    assert w1["status"] == "died" and w1["not_sent"] > 0
    assert w1["sent"] + w1["not_sent"] == w1["assigned"]
    by_session: dict = {}
    for q in r["requests"]:
        by_session.setdefault(q["session_id"], []).append(q)
    for i, recs in by_session.items():
        recs.sort(key=lambda q: q["turn"])
        assert {q["worker"] for q in recs} == {i % 2}
        assert [q["turn"] for q in recs] == list(range(1, len(recs) + 1))  # no gaps
        # At most the last turn reported is lost (it may have been in flight at the death).
        assert all(q["error"] is None for q in recs[:-1])
        assert recs[-1]["error"] is None or recs[-1]["error_type"] == WORKER_LOST
    assert w1["lost"] == sum(q["error_type"] == WORKER_LOST for q in r["requests"])
    # Every started session the death cut short ended early (it read 0: the Done never came).
    assert s["sessions"]["ended_early"] == sum(len(v) < turns for v in by_session.values()) > 0


# ---- a dead worker's sessions (no processes) ---------------------------------------------------
def _plan() -> SessionPlan:
    three = (Turn(10, 2), Turn(5, 2), Turn(5, 2))
    sessions = [Session(i, three) for i in range(4)]
    return SessionPlan(sessions, np.array([0.0, 0.1, 0.2, 5.0]), parse_delay("100", ""), 0)


def _turn(plan: SessionPlan, i: int, k: int, start: float, end: float, ok=True) -> tuple:
    rec = RequestRecord(plan.request_id(i, k), 20, 2, start, send_s=start,
                        token_times_s=[end - 0.01, end] if ok else [], session_id=i, turn=k + 1)
    if not ok:
        rec.error, rec.error_type = "HTTP 500", "http_error"
    return plan.request_id(i, k), rec, "usage"


def _both_workers_die(plan):
    """Two workers killed: worker 1 at 1.0 s after session 1's turn 1 (done at 0.3 s; turn 2 due
    at 0.4 s; session 3 due at 5 s), worker 0 at 9.0 s after session 0 whole and session 2's turn
    1 failed (its session ended)."""
    shares, session_shares = deal_sessions(plan, 2)
    m = Merger([], [], shares, plan, session_shares)
    for k in (0, 1):
        m.on_message(Ready(k, 100 + k, "h"))
    m.on_message(RecordBatch(1, [_turn(plan, 1, 0, 0.1, 0.3)]))
    m.died(1, 1.0, "killed by SIGKILL")
    m.on_message(RecordBatch(0, [_turn(plan, 0, k, k, k + 0.5) for k in range(3)]
                             + [_turn(plan, 2, 0, 0.2, 0.4, ok=False)]))
    m.died(0, 9.0, "killed by SIGKILL")
    return m.result(EndpointOptions(endpoint="http://x", served_model="m"), 0.0, False, 0.0)


def test_a_dead_workers_turns_are_lost_or_not_sent():
    plan = _plan()
    shares, session_shares = deal_sessions(plan, 2)
    assert session_shares == [[0, 2], [1, 3]]
    assert shares == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    run = _both_workers_die(plan)
    w0, w1 = run.info["workers"]
    lost = [r for r in run.records if r.error_type == WORKER_LOST]
    # Session 1's turn 2 was due (0.4 s <= 1.0 s): lost; its turn 3 and all of session 3: not
    # sent. Session 2 ended with its failed turn 1: turns 2-3 not sent, nothing lost.
    assert [(r.session_id, r.turn, r.worker) for r in lost] == [(1, 2, 1)]
    assert lost[0].intended_start_s == pytest.approx(0.4)
    assert lost[0].prompt_tokens == 20 + 2 + 1 + 4 + 5 + 1 + 4  # history + new message
    assert (w1["lost"], w1["not_sent"], w1["sent"]) == (1, 1 + 3, 2)
    assert (w0["lost"], w0["not_sent"], w0["sent"]) == (0, 2, 4)
    assert run.not_sent == 6 and len(run.records) == 6


def test_sessions_a_dead_worker_cut_short_count_as_ended_early():
    """A session the death cut short counts in sessions_ended_early, as a session cut by a
    failed turn does in one process (ninth review: a dead worker sent no Done, so its count
    was 0 whatever it cut). The case above: session 1 (turn 2 lost, turn 3 never sent) and
    session 2 (turn 1 failed before the death: its Done's count died with it) ended early;
    session 0 completed, session 3 never started (its turns: not sent, as a run's end leaves
    them). A worker that finished reports its own count, which is kept."""
    plan = _plan()
    assert _both_workers_die(plan).sessions_ended_early == 2
    shares, session_shares = deal_sessions(plan, 2)
    # A lost last turn leaves nothing unsent: the session was not cut short (as one process
    # counts a failed last turn).
    m = Merger([], [], shares, plan, session_shares)
    m.on_message(Ready(0, 100, "h"))
    m.on_message(Ready(1, 101, "h"))
    m.on_message(RecordBatch(0, [_turn(plan, 0, k, k, k + 0.5) for k in range(3)]
                             + [_turn(plan, 2, k, k, k + 0.5) for k in range(2)]))
    m.died(0, 9.0, "killed by SIGKILL")  # session 2's turn 3, due at 1.6 s: lost
    m.on_message(Done(1, 9.0, False, {}, [], sessions_ended_early=1))
    run = m.result(EndpointOptions(endpoint="http://x", served_model="m"), 0.0, False, 0.0)
    assert [(r.session_id, r.turn) for r in run.records if r.error_type == WORKER_LOST] == [(2, 3)]
    assert run.sessions_ended_early == 1  # worker 1's own
