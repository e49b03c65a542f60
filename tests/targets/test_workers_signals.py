"""SIGTERM and SIGHUP to a `--workers` run's process group stop it as Ctrl-C does
(load/interrupts.py; FAILURE_MODES rule 4): the parent tells its workers to stop, they finish
their in-flight requests, and the result is written marked interrupted, exit 0. The workers
ignored only SIGINT, so `timeout 8 cbbench run ... --workers 2` killed them ("worker 0 died
(killed by SIGTERM)", requests counted worker_lost, exit 3). A worker whose parent is gone
still never lingers: its control pipe's EOF ends it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from timing_server import timing_server
from worker_runs import (
    CLI,
    ITL_MS,
    POLL_S,
    RUN_TIMEOUT_S,
    TTFT_MS,
    run_args,
    stop_by_group_signal,
    wait_for_requests,
    worker_pids,
    write_workload,
)

ORPHAN_EXIT_S = 5.0  # a worker sees its control pipe close at once; generous for a loaded box

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="finds workers through /proc")


@pytest.fixture(scope="module")
def server():
    with timing_server(TTFT_MS, ITL_MS) as url:
        yield url


def _start(server: str, tmp_path: Path, prefix: str, n: int, rate: float):
    wl = write_workload(tmp_path / f"{prefix}.jsonl", prefix, n)
    out = tmp_path / f"{prefix}.json"
    proc = subprocess.Popen(
        CLI + run_args(server, wl, out, n, rate, "--workers", "2"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as a shell gives a command
    )
    return proc, out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_group_stops_every_worker_as_ctrl_c_does(server, tmp_path, sig):
    n, rate = 1000, 200  # 5 s, stopped after ~0.5 s of sending
    prefix = sig.name.lower()
    proc, out = _start(server, tmp_path, prefix, n, rate)
    # `timeout`, `kill -- -PGID`, a closed terminal
    pids, t, stdout, stderr = stop_by_group_signal(server, prefix, proc, sig)
    assert len(pids) == 2, pids
    assert proc.returncode == 0, stderr
    assert f"{sig.name}: stopping" in stderr and "died" not in stderr, stderr
    assert time.monotonic() - t < 0.9 * n / rate  # it stopped, not ran to the end
    r = json.loads(out.read_text())
    s = r["summary"]
    assert r["interrupted"] is True
    assert [w["status"] for w in s["workers"]] == ["done", "done"]
    assert s["completed"] >= 100 and s["not_sent"] > 0
    assert s["completed"] + s["failed"] + s["not_sent"] == n
    assert set(s["error_types"]) <= {"interrupted"}  # in flight at the stop, if any: not lost
    assert not any(_alive(p) for p in pids)


def test_a_worker_whose_parent_is_killed_does_not_linger(server, tmp_path):
    """SIGKILL to the parent alone (nothing can catch it): the workers, which now ignore
    SIGTERM, see their control pipe close and exit, rather than load the server to the end."""
    n, rate = 1000, 200
    proc, _ = _start(server, tmp_path, "orphan", n, rate)
    pids: list[int] = []
    try:
        wait_for_requests(server, "orphan", 50, proc)
        pids = worker_pids(proc.pid)
        assert len(pids) == 2, pids
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=RUN_TIMEOUT_S)
        deadline = time.monotonic() + ORPHAN_EXIT_S
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert not any(_alive(p) for p in pids), "a worker outlived its parent"
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
