"""`cbbench sweep --endpoint` against `cbbench serve --engine sim` over loopback HTTP.

The server runs as its own process, started as a user would start it. Skipped until `cbbench
serve` is registered and `cbbench run` takes --endpoint (the runner's HTTP target).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from cbbench.cli import sweep as cmd_sweep

READY_TIMEOUT_S = 60.0
POLL_S = 0.2
STOP_TIMEOUT_S = 15.0
NUM_REQUESTS = 20
RATES = "5,10"


def _cbbench() -> str | None:
    """The console script of this environment (beside the interpreter), else the PATH's."""
    here = Path(sys.executable).parent / "cbbench"
    return str(here) if here.exists() else shutil.which("cbbench")


def _help(exe: str, *args: str) -> str:
    r = subprocess.run([exe, *args, "--help"], capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


def _skip_reason() -> str | None:
    exe = _cbbench()
    if exe is None:
        return "the cbbench console script is not installed"
    if " serve " not in _help(exe):
        return "`cbbench serve` is not registered in cli.py yet"
    if "--endpoint" not in _help(exe, "run"):
        return "the runner has no HTTP target yet (`cbbench run --endpoint` is not registered)"
    return None


app = typer.Typer()
cmd_sweep.register(app)


@app.callback()
def _root() -> None:  # keeps `sweep` a named subcommand
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"cbbench serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    raise AssertionError(f"cbbench serve was not healthy within {READY_TIMEOUT_S:.0f} s")


@pytest.fixture
def server():
    reason = _skip_reason()  # checked here, not at collection: it runs `cbbench --help` twice
    if reason is not None:
        pytest.skip(reason)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [_cbbench(), "serve", "--engine", "sim", "--model", "llama-3.2-1b", "--port", str(port)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        _wait_healthy(proc, url)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_sweep_against_cbbench_serve(server, tmp_path):
    # Short prompts and outputs: each point takes a few seconds of real time.
    workload = tmp_path / "short.jsonl"
    workload.write_text("".join(
        json.dumps({"prompt_len": 16 + i, "output_len": 8 + i % 8}) + "\n" for i in range(40)
    ))
    out = tmp_path / "sweep"
    r = CliRunner().invoke(app, [
        "sweep", "--endpoint", server, "--workload", str(workload), "--rates", RATES,
        "--num-requests", str(NUM_REQUESTS), "--min-duration", "0", "--out-dir", str(out),
    ])
    assert r.exit_code == 0, r.output
    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["rate"] for p in sweep["points"]] == [5.0, 10.0]
    for p in sweep["points"]:
        assert p["completed"] == NUM_REQUESTS and p["failed"] == 0
        assert p["ttft_p99_ms"] is not None and p["tpot_p99_ms"] is not None
    for rate in ("5", "10"):
        result = json.loads((out / f"rate-{rate}.json").read_text())
        assert result["config"]["target"] != "engine"
    assert (out / "latency_throughput.png").is_file()
