"""`cbbench ... | head -1`: stdout's reader goes away mid-command (Python ignores SIGPIPE, so
every later write raises BrokenPipeError). The printout stops; the command's files are
written, the exit is 1 (Python's EPIPE convention), and stderr has no traceback and no
"Exception ignored ... BrokenPipeError"."""

from __future__ import annotations

import json
import os
import subprocess

from helpers import CBBENCH

SIM = ("--engine", "sim", "--gpu", "h200", "--num-requests", "4")


def _reader_gone(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """cbbench with stdout a pipe whose read end is already closed (what `| head -1` leaves),
    buffered as a user's shell has it (no PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([*CBBENCH, *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=env, timeout=120)
    finally:
        os.close(w)


def _quiet_failure(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def test_run_into_a_closed_pipe_keeps_its_result_and_exits_1(tmp_path):
    """Before: "Exception ignored in: <_io.TextIOWrapper name='<stdout>'> BrokenPipeError" and
    exit 120 (the table's bytes stayed buffered until the interpreter's last flush)."""
    out = _reader_gone(tmp_path, "run", *SIM, "--output", "r.json")
    _quiet_failure(out)
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["completed"] == 4


def test_capacity_into_a_closed_pipe_still_writes_capacity_json(tmp_path):
    """Before: the search ran, its table's first write raised, and capacity.json (written
    after the table) was never written; exit 1 with nothing said."""
    out = _reader_gone(tmp_path, "capacity", *SIM, "--slo", "ttft=500", "--max-requests", "8",
                       "--precision", "0.9", "--skip-warmup", "--out", "cap.json")
    _quiet_failure(out)
    assert json.loads((tmp_path / "cap.json").read_text())["probes"]
