"""`cbbench run --workers` as a user runs it, against tests/timing_server.py: the workload file,
the command line, and the checks every multi-worker test makes (each request exactly once,
client TTFT against the server's log)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from timing_server import fetch_log

TTFT_MS = 20.0
ITL_MS = 5.0
OUTPUT_LEN = 4
TTFT_P50_BOUND_MS = 3.0  # the bound: |client TTFT p50 - server TTFT p50|
ATTEMPTS = 3  # a run that misses the bound on a loaded machine is measured again
POLL_S = 0.05
RUN_TIMEOUT_S = 120
CLI = [sys.executable, "-c", "from cbbench.cli.app import main; main()"]


def write_workload(path: Path, prefix: str, n: int) -> Path:
    path.write_text(
        "".join(
            json.dumps({"prompt": f"{prefix}{i} go", "output_len": OUTPUT_LEN}) + "\n"
            for i in range(n)
        )
    )
    return path


def run_args(url: str, workload: Path, out: Path, n: int, rate: float, *extra: str) -> list[str]:
    return [
        "run",
        "--endpoint",
        url,
        "--workload",
        str(workload),
        "--num-requests",
        str(n),
        "--request-rate",
        str(rate),
        "--seed",
        "3",
        "--output",
        str(out),
        "--save-detailed",
        *extra,
    ]


def ttft_check(result: dict, log: dict, prefix: str) -> tuple[float, float, str]:
    client = float(np.median([r["ttft_ms"] for r in result["requests"]]))
    server = float(
        np.median(
            [
                (
                    log[f"{prefix}{r['id']} go"]["first_token"]
                    - log[f"{prefix}{r['id']} go"]["received"]
                )
                * 1000
                for r in result["requests"]
            ]
        )
    )
    http = result["summary"]["http"]
    load = os.getloadavg()[0]
    report = (
        f"client TTFT p50 {client:.2f} ms, server TTFT p50 {server:.2f} ms (nominal {TTFT_MS:g}); "
        f"send lag p50 {http['send_lag_p50_ms']:.2f} ms; loop lag p99 "
        f"{http['loop_lag_p99_ms']:.2f} ms; load average {load:.1f}"
    )
    return client, server, report


def accurate_or_flagged(result: dict, client: float, server: float) -> tuple[bool, str]:
    """Did this run measure TTFT within the bound, or say itself why it could not?

    On a quiet machine the client's TTFT p50 is within TTFT_P50_BOUND_MS of the server's. On a
    loaded one it cannot be: the client sends late and reads late, and a suite test must pass on
    a machine of any load (issue 35). Then the run must have marked its TTFT client-bound
    (summary.client_bound, the user's warning), and the error must be no larger than the lag the
    run reports (send lag p50 plus event-loop lag p99) plus the bound: a client error the run
    does not account for still fails."""
    err = client - server
    if abs(err) < TTFT_P50_BOUND_MS:
        return True, "within the bound"
    if err < 0:  # earlier than the server saw the first token: no load explains that
        return False, f"error {err:+.2f} ms: the client reads TTFT below the server's"
    s = result["summary"]
    flagged = "ttft_ms" in ((s.get("client_bound") or {}).get("metrics") or [])
    http = s["http"]
    reported = (http["send_lag_p50_ms"] or 0.0) + (http["loop_lag_p99_ms"] or 0.0)
    if not flagged:
        return False, f"error {err:+.2f} ms, and the run did not mark its TTFT client-bound"
    if err > reported + TTFT_P50_BOUND_MS:
        return False, (f"error {err:+.2f} ms exceeds the lag the run reports ({reported:.2f} ms) "
                       f"plus the bound")
    return True, f"error {err:+.2f} ms, marked client-bound and within the reported lag"


def assert_accurate_or_flagged(verdicts: list[tuple[bool, str]], reports: list[str]) -> None:
    """One attempt within the bound passes; otherwise every attempt must be flagged and
    explained (accurate_or_flagged)."""
    lines = [f"{r} -> {why}" for (_, why), r in zip(verdicts, reports)]
    strict = any(why == "within the bound" for _, why in verdicts)
    assert strict or all(ok for ok, _ in verdicts), "\n".join(lines)


def assert_exactly_once(result: dict, n: int, workers: int) -> None:
    s = result["summary"]
    reqs = result["requests"]
    assert s["completed"] + s["failed"] == n == len(reqs)  # every request sent and reported
    assert sorted(r["id"] for r in reqs) == list(range(n))  # ... exactly once
    assert [r["worker"] for r in reqs] == [i % workers for i in range(n)]
    assert len(s["workers"]) == workers
    assert sum(w["sent"] for w in s["workers"]) == n
    assert all(w["status"] == "done" and w["not_sent"] == 0 for w in s["workers"])
    for w in s["workers"]:
        for key in ("send_lag_p50_ms", "send_lag_p99_ms", "client_cpu_s", "loop_lag_p99_ms"):
            assert w[key] is not None and w[key] >= 0, (key, w)
    assert s["failed"] == 0, s["error_types"]


# ---- killing a worker, and Ctrl-C (the CLI in a child process) --------------------------------
def worker_pids(parent: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and b"spawn_main" in cmdline:
            pids.append(int(stat.parent.name))
    return sorted(pids)


def wait_for_requests(url: str, prefix: str, count: int, proc: subprocess.Popen) -> None:
    """Until the timing server at ``url`` has logged ``count`` requests of this run's
    ``prefix`` (its prompts' first word), failing at once if the run ``proc`` ended."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while sum(k.startswith(prefix) for k in fetch_log(url)) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run did not get going"
        time.sleep(POLL_S)


def stop_by_group_signal(url: str, prefix: str, proc: subprocess.Popen,
                         sig: int) -> tuple[list[int], float, str, str]:
    """Once the run ``proc`` (in its own process group) has sent 100 requests, signal its whole
    group as a terminal or `timeout` does: (its worker pids, when the signal went, stdout,
    stderr). The run is killed if it outlives the test."""
    try:
        wait_for_requests(url, prefix, 100, proc)
        pids = worker_pids(proc.pid)
        os.killpg(proc.pid, sig)
        t = time.monotonic()
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    return pids, t, stdout, stderr
