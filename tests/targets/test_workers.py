"""--workers N: the schedule dealt to worker processes, merged back into one result.

Against tests/timing_server.py (its own process: fixed TTFT and inter-token latency, and a log of
when each request arrived and got its first token, on the same CLOCK_MONOTONIC as the client):
every request reported exactly once, the merged schedule equal to the one-process schedule,
TTFT p50 within 3 ms of the server's own; a worker killed mid-run is accounted for and sets the
exit code; Ctrl-C stops every worker and keeps what finished. Unit tests for the dealing, the
merge's accounting and the clock-offset estimate need no processes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port, invoke_app
from timing_server import fetch_log, timing_server
from worker_runs import (
    ATTEMPTS,
    CLI,
    ITL_MS,
    RUN_TIMEOUT_S,
    TTFT_MS,
    TTFT_P50_BOUND_MS,
    accurate_or_flagged,
    assert_accurate_or_flagged,
    assert_exactly_once,
    run_args,
    stop_by_group_signal,
    ttft_check,
    wait_for_requests,
    worker_pids,
    write_workload,
)

from cbbench.analysis.records import RequestRecord
from cbbench.cli.run import WORKER_LOST_EXIT
from cbbench.clock_offset import measure_offset
from cbbench.distributed.merge import WORKER_LOST, Merger, peak_in_flight
from cbbench.distributed.messages import Done, Failed, Ready, RecordBatch
from cbbench.distributed.plan import LoadPlan, deal, parse_workers
from cbbench.errors import UsageError
from cbbench.load.arrivals import arrival_times
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.options import EndpointOptions

RATE = 400
NUM_REQUESTS = 400  # 1 s at 400 req/s


# ---- units: no processes ----------------------------------------------------------------------
def test_deal_round_robin_and_sessions():
    assert deal(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert deal(2, 4) == [[0], [1], [], []]
    # Whole sessions to one worker, sessions dealt in turn; session-less requests in the turn too.
    # Turns: a -> 0, b -> 1, (None) -> 0, c -> 1, (None) -> 0; a and b keep their worker.
    keys = ["a", "b", "a", None, "c", "b", "a", None]
    assert deal(8, 2, keys) == [[0, 2, 3, 6, 7], [1, 4, 5]]
    shares = deal(8, 3, keys)
    assert sorted(i for s in shares for i in s) == list(range(8))
    for key in ("a", "b", "c"):
        owners = {w for w, s in enumerate(shares) for i in s if keys[i] == key}
        assert len(owners) == 1


def test_parse_workers():
    assert parse_workers("3") == 3 and parse_workers("auto") == "auto"
    for bad in ("0", "-2", "two", "5000"):
        with pytest.raises(UsageError, match="--workers"):
            parse_workers(bad)
    with pytest.raises(UsageError, match="needs --ray"):
        LoadPlan(2, ray=False, ray_address="auto").validate()


def _rec(i: int, t: float, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        i,
        5,
        2,
        t,
        send_s=t + 0.001,
        token_times_s=[t + 0.02, t + 0.03] if ok else [],
        error=None if ok else "x",
        error_type=None if ok else "http_status",
    )


def test_merge_accounts_for_a_dead_worker(notices):
    n = 10
    wreqs = [WorkloadRequest(100 + i, 5, 2) for i in range(n)]
    arrivals = [0.1 * i for i in range(n)]
    shares = deal(n, 2)  # worker 0: even positions, worker 1: odd
    m = Merger(wreqs, arrivals, shares)
    m.on_message(Ready(0, 11, "h"))
    m.on_message(Ready(1, 12, "h"))
    m.on_message(RecordBatch(0, [(p, _rec(100 + p, arrivals[p]), "usage") for p in shares[0]]))
    m.on_message(Done(0, 1.0, False, {"client_cpu_s": 0.5, "max_in_flight": 2}, [0.5] * 10))
    # Worker 1 reported positions 1 and 3 (one failed), then died at 0.55 s: position 5 was due
    # (lost, a failed record), 7 and 9 were not (not sent).
    m.on_message(RecordBatch(1, [(1, _rec(101, 0.1), "usage"), (3, _rec(103, 0.3, ok=False), "x")]))
    with pytest.raises(RuntimeError, match="twice"):
        m.on_message(RecordBatch(1, [(1, _rec(101, 0.1), "usage")]))
    m.died(1, 0.55, "killed by SIGKILL")
    assert m.all_final
    notes = notices  # the logged notices (conftest)
    run = m.result(
        EndpointOptions("http://127.0.0.1:1"), time.perf_counter(), False, 0.0
    )
    assert [r.id for r in run.records] == [100 + p for p in range(7)] + [108]
    lost = [r for r in run.records if r.error_type == WORKER_LOST]
    assert [(r.id, r.worker, r.send_s) for r in lost] == [(105, 1, None)]
    assert run.not_sent == 2
    w0, w1 = run.info["workers"]
    assert (w0["status"], w0["sent"], w0["completed"], w0["not_sent"]) == ("done", 5, 5, 0)
    assert (
        w1["status"],
        w1["sent"],
        w1["completed"],
        w1["failed"],
        w1["lost"],
        w1["not_sent"],
    ) == (
        "died",
        3,
        1,
        2,
        1,
        2,
    )
    assert w0["sent"] + w1["sent"] + run.not_sent == n
    assert all(r.worker == p % 2 for p, r in enumerate(run.records[:7]))
    assert any("worker 1 died" in x and "1 lost" in x and "2 not sent" in x for x in notes)
    assert run.info["token_count_method"] == {"usage": 6}


def test_merge_a_worker_that_crashed_mid_run():
    wreqs = [WorkloadRequest(i, 5, 2) for i in range(4)]
    m = Merger(wreqs, [0.0, 0.1, 0.2, 0.3], [[0, 1, 2, 3]])
    m.on_message(RecordBatch(0, [(0, _rec(0, 0.0), "events")]))
    m.on_message(Failed(0, "worker 0 crashed: RuntimeError: boom"), at_s=0.25)
    run = m.result(EndpointOptions("http://127.0.0.1:1"), time.perf_counter(), False, 0.0)
    # Due before the crash (0.1, 0.2): lost; 0.3: not sent.
    assert [r.error_type for r in run.records] == [None, WORKER_LOST, WORKER_LOST]
    assert run.not_sent == 1 and run.info["workers"][0]["status"] == "failed"


def test_clock_offset_estimate_bounds_the_true_offset():
    # A worker clock 1000.25 s behind the driver's, reached over legs of 3 ms out and 1 ms back
    # (asymmetric), with one fast round: the estimate is within its stated uncertainty.
    driver = [0.0]
    legs = iter([(0.003, 0.001)] * 5 + [(0.0004, 0.0002)] + [(0.003, 0.001)] * 4)

    def now() -> float:
        return driver[0]

    def read_remote() -> float:
        out, back = next(legs)
        driver[0] += out
        t = driver[0] - 1000.25
        driver[0] += back
        return t

    m = measure_offset(read_remote, rounds=10, now=now)
    assert m.rtt_s == pytest.approx(0.0006)
    assert m.uncertainty_s == pytest.approx(0.0003)
    assert abs(m.offset_s - 1000.25) <= m.uncertainty_s + 1e-12
    assert m.offset_s != pytest.approx(1000.25, abs=1e-6)  # asymmetry shows, within the bound


# ---- against the timing server ---------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    with timing_server(TTFT_MS, ITL_MS) as url:
        yield url










def test_two_workers_report_every_request_once_on_the_one_process_schedule(server, tmp_path):
    wl = write_workload(tmp_path / "w.jsonl", "m", NUM_REQUESTS)
    one_path = tmp_path / "one.json"
    res = invoke_app(run_args(server, wl, one_path, NUM_REQUESTS, RATE))
    assert res.exit_code == 0, res.output
    one = json.loads(one_path.read_text())
    assert_exactly_once(one, NUM_REQUESTS, 1)

    reports = []
    verdicts = []
    for attempt in range(ATTEMPTS):
        out = tmp_path / f"two-{attempt}.json"
        res = invoke_app(run_args(server, wl, out, NUM_REQUESTS, RATE, "--workers", "2"))
        assert res.exit_code == 0, res.output
        two = json.loads(out.read_text())
        assert_exactly_once(two, NUM_REQUESTS, 2)
        assert two["config"]["workers"] == 2
        # The merged schedule is the one-process schedule, request for request.
        sched = [(r["id"], r["intended_start_s"]) for r in two["requests"]]
        assert sched == [(r["id"], r["intended_start_s"]) for r in one["requests"]]
        expected = arrival_times([None] * NUM_REQUESTS, RATE, 1.0, "gamma", 3)
        assert [t for _, t in sched] == expected.tolist()
        # One shared start instant: the wall-clock zero is recorded to the microsecond.
        assert abs(two["summary"]["http"]["t0_epoch_s"] - time.time()) < RUN_TIMEOUT_S
        client, srv, report = ttft_check(two, fetch_log(server), "m")
        reports.append(report)
        print(report)
        assert srv >= TTFT_MS  # the server keeps its timing (it can only be late)
        verdicts.append(accurate_or_flagged(two, client, srv))
        if abs(client - srv) < TTFT_P50_BOUND_MS:
            break
    assert_accurate_or_flagged(verdicts, reports)




def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds workers through /proc")
def test_a_killed_worker_is_accounted_for_and_sets_the_exit_code(server, tmp_path):
    n, rate = 600, 200  # 3 s
    wl = write_workload(tmp_path / "k.jsonl", "k", n)
    out = tmp_path / "killed.json"
    proc = subprocess.Popen(
        CLI + run_args(server, wl, out, n, rate, "--workers", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_requests(server, "k", 150, proc)  # ~0.75 s into the schedule
        pids = worker_pids(proc.pid)
        assert len(pids) == 2, pids
        os.kill(pids[1], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == WORKER_LOST_EXIT, stderr
    assert "died (killed by SIGKILL)" in stderr
    r = json.loads(out.read_text())
    s = r["summary"]
    dead = [w for w in s["workers"] if w["status"] == "died"]
    live = [w for w in s["workers"] if w["status"] == "done"]
    assert len(dead) == 1 and len(live) == 1 and dead[0]["pid"] == pids[1]
    d, lv = dead[0], live[0]
    # Every request is accounted for: reported, lost (due before the death) or not sent.
    assert s["completed"] + s["failed"] + s["not_sent"] == n
    assert len(r["requests"]) == s["completed"] + s["failed"]
    assert lv["completed"] == lv["assigned"] == n // 2
    assert d["sent"] + d["not_sent"] == d["assigned"] == n // 2
    assert d["completed"] > 0 and d["not_sent"] > 0
    lost = [q for q in r["requests"] if q["error_type"] == WORKER_LOST]
    assert len(lost) == d["lost"] == s["error_types"].get(WORKER_LOST, 0)
    assert all(
        q["worker"] == d["worker"] and q["intended_start_s"] <= d["duration_s"] for q in lost
    )
    mine = [q for q in r["requests"] if q["worker"] == d["worker"]]
    assert all(q["error"] is None or q["error_type"] == WORKER_LOST for q in mine)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds workers through /proc")
def test_ctrl_c_stops_every_worker_and_keeps_what_finished(server, tmp_path):
    n, rate = 1000, 200  # 5 s, stopped after ~0.5 s of sending
    wl = write_workload(tmp_path / "c.jsonl", "c", n)
    out = tmp_path / "stopped.json"
    proc = subprocess.Popen(
        CLI + run_args(server, wl, out, n, rate, "--workers", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a command
    )
    # what a terminal's Ctrl-C does: the whole group
    pids, t, stdout, stderr = stop_by_group_signal(server, "c", proc, signal.SIGINT)
    assert proc.returncode == 0, stderr
    assert time.monotonic() - t < 0.9 * n / rate  # it stopped, not ran to the end
    r = json.loads(out.read_text())
    s = r["summary"]
    assert r["interrupted"] is True
    assert all(w["status"] == "done" for w in s["workers"]) and len(s["workers"]) == 2
    assert s["completed"] >= 100 and s["not_sent"] > 0
    assert s["completed"] + s["failed"] + s["not_sent"] == n
    assert set(s["error_types"]) <= {"interrupted"}  # in flight at the stop, if any
    assert not any(_alive(p) for p in pids)
    assert not math.isnan(s["ttft_ms"]["p50"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "many"], "--workers"),
        (["--ray-address", "auto"], "needs --ray"),
        (["--workers", "3", "--max-concurrency", "2"], "less than --workers"),
    ],
)
def test_bad_worker_options_exit_2_with_one_line(tmp_path, args, message):
    res = invoke_app(
        ["run", "--endpoint", "http://127.0.0.1:9", "--output", str(tmp_path / "x.json"), *args],
    )
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_workers_need_an_endpoint(tmp_path):
    res = invoke_app(
        ["run", "--engine", "sim", "--workers", "2", "--output", str(tmp_path / "x.json")]
    )
    assert res.exit_code == 2 and "apply to --endpoint runs" in res.output


def test_ray_without_ray_installed_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    res = invoke_app(
        ["run", "--endpoint", "http://127.0.0.1:9", "--ray", "--output", str(tmp_path / "x.json")],
    )
    assert res.exit_code == 2 and "pip install 'cbbench[ray]'" in res.output, res.output


def test_unreachable_ray_address_is_one_line(tmp_path):
    pytest.importorskip("ray")
    res = invoke_app(
        [
            "run",
            "--endpoint",
            "http://127.0.0.1:9",
            "--ray",
            "--ray-address",
            f"127.0.0.1:{free_port()}",
            "--output",
            str(tmp_path / "x.json"),
        ],
    )
    assert res.exit_code == 2 and "cannot reach the Ray cluster" in res.output, res.output



def _run(flagged: bool, send_lag: float, loop_lag: float) -> dict:
    return {"summary": {"client_bound": {"metrics": ["ttft_ms"] if flagged else []},
                        "http": {"send_lag_p50_ms": send_lag, "loop_lag_p99_ms": loop_lag}}}


@pytest.mark.parametrize(
    ("flagged", "client", "expected"),
    [
        (False, 21.0, True),  # within the bound: no flag needed
        (False, 30.0, False),  # off by 10 ms and the run said nothing
        (True, 30.0, True),  # off by 10 ms, flagged, 6 + 4 ms of reported lag explain it
        (True, 40.0, False),  # flagged, but 20 ms is more than the reported 10 ms + the bound
        (True, 10.0, False),  # below the server: no load explains it
    ],
)
def test_the_accuracy_verdict_under_load_still_fails(flagged, client, expected):
    """The loaded-machine rule (accurate_or_flagged): a run's own client-bound verdict excuses
    only the error its reported lag explains (the hand-computed cases: server TTFT 20 ms)."""
    ok, why = accurate_or_flagged(_run(flagged, 6.0, 4.0), client, 20.0)
    assert ok is expected, why


def test_merged_max_in_flight_is_the_runs_peak_not_the_sum_of_the_workers_peaks(notices):
    """Worker 0's two requests overlap at 0.1-1.0 s, worker 1's at 2.1-3.0 s: each worker's
    peak is 2, the run's is 2 (it read 4, the sum of the peaks, which fell at other times)."""
    wreqs = [WorkloadRequest(i, 5, 2) for i in range(4)]
    arrivals = [0.0, 2.0, 0.1, 2.1]
    shares = [[0, 2], [1, 3]]
    m = Merger(wreqs, arrivals, shares)
    m.on_message(Ready(0, 11, "h"))
    m.on_message(Ready(1, 12, "h"))

    def rec(i: int, t: float) -> RequestRecord:
        return RequestRecord(i, 5, 2, t, send_s=t, token_times_s=[t + 0.5, t + 0.9])

    m.on_message(RecordBatch(0, [(0, rec(0, 0.0), "usage"), (2, rec(2, 0.1), "usage")]))
    m.on_message(RecordBatch(1, [(1, rec(1, 2.0), "usage"), (3, rec(3, 2.1), "usage")]))
    for w in (0, 1):
        m.on_message(Done(w, 3.0, False, {"client_cpu_s": 0.1, "max_in_flight": 2}, [0.5]))
    run = m.result(EndpointOptions("http://127.0.0.1:1"), time.perf_counter(), False, 0.0)
    assert run.info["max_in_flight"] == 2
    assert peak_in_flight([rec(0, 0.0), rec(1, 0.9)]) == 1  # one ends as the next is sent
    failed = RequestRecord(9, 5, 2, 0.0, send_s=0.0, error="x", error_type="http_status")
    assert peak_in_flight([rec(0, 0.0), failed]) is None  # its end is unknown
