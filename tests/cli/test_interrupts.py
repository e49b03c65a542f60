"""Ctrl-C and SIGTERM during `cbbench run` (cbbench/interrupts.py, engine_target._drain).

The first SIGINT or SIGTERM stops dispatching, lets in-flight requests finish for a grace
period (10 s), aborts the rest, and writes the result with ``interrupted: true``; a second
signal exits at once with code 130. The result file is replaced atomically, so a reader finds
either no file or a whole one, and no temporary file is left behind.

The subprocess tests run the real console script on the torch engine on the CPU (wall clock)
with 400 requests arriving at 50 req/s, so arrivals keep coming for ~8 s. Their stdout and
stderr are a pseudo-terminal: the live panel ("done N") then shows up there, and the signal is
sent only once it reports finished requests, so the test never interrupts the start-up (torch import,
model build) by accident on a slow machine. The workload has short outputs so that the drain
after the first signal ends well inside the grace period.

Exit code of a run stopped by one signal: it is the run's normal verdict on the result it
wrote: 0, unless the requests cancelled by the interrupt (``error_type: interrupted``) push the
failed share above --max-error-rate (default 0), when it is 1 after the line
"cbbench: N of M requests failed ...". A second signal: 130.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cbbench.schema import read_run, to_dict

CBBENCH = shutil.which("cbbench")
COMMAND = [CBBENCH] if CBBENCH else [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
N = 400
RATE = 50
PROGRESS_TIMEOUT_S = 180  # start-up (torch import, model build) on a slow, busy CI machine
EXIT_TIMEOUT_S = 120  # the drain's grace is 10 s; the rest is slack for a busy machine

pty = pytest.importorskip("pty", reason="needs a pseudo-terminal (POSIX)")


def _workload(path: Path, long_every: int = 0) -> Path:
    """Short requests (outputs of 4-12 tokens); with ``long_every`` k, every k-th request has
    a 400-token output, so some are still in flight long after the first signal."""
    with path.open("w") as f:
        for i in range(N):
            out = 400 if long_every and i % long_every == 0 else 4 + i % 9
            f.write(json.dumps({"prompt_len": 8 + i % 24, "output_len": out}) + "\n")
    return path


class _Run:
    """`cbbench run` with stderr on a pseudo-terminal, read continuously by a thread."""

    def __init__(self, tmp_path: Path, *extra: str, long_every: int = 0) -> None:
        self.out_dir = tmp_path / "out"
        self.out = self.out_dir / "x.json"
        workload = _workload(tmp_path / "w.jsonl", long_every)
        master, slave = pty.openpty()
        env = dict(os.environ, TERM="xterm", COLUMNS="120", CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen(
            [
                *COMMAND, "run", "--engine", "torch", "--device", "cpu", "--model", "tiny",
                "--workload", str(workload), "--num-requests", str(N),
                "--request-rate", str(RATE), "--output", str(self.out), *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=slave,  # the live panel draws only on a terminal
            stderr=slave,
            env=env,
            cwd=tmp_path,
        )
        os.close(slave)
        self._master = master
        self._buf = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            self._buf.extend(data)

    @property
    def stderr(self) -> str:
        text = bytes(self._buf).decode("utf-8", "replace")
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # drop terminal escapes

    def done_requests(self) -> int:
        counts = re.findall(r"\bdone (\d+)\s+failed", self.stderr)  # the live panel
        return int(counts[-1]) if counts else 0

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                pytest.fail(f"cbbench exited ({self.proc.returncode}) before {what}:\n{self.stderr}")
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"no {what} within {timeout} s:\n{self.stderr}")

    def wait_for_progress(self, min_done: int = 3) -> None:
        self.wait_for(lambda: self.done_requests() >= min_done, PROGRESS_TIMEOUT_S,
                      f"progress ({min_done} requests finished)")

    def finish(self, timeout: float = EXIT_TIMEOUT_S) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"cbbench did not exit within {timeout} s:\n{self.stderr}")
        self._reader.join(timeout=5)
        os.close(self._master)
        return self.proc.returncode, self.stderr, self.stderr  # one terminal for both

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _leftovers(folder: Path) -> list[str]:
    """Files other than the result: temporary files of an atomic write, probes."""
    if not folder.exists():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name != "x.json")


def _check_interrupted_result(path: Path) -> dict:
    data = to_dict(read_run(path))  # schema checks: a whole, valid file
    assert data["interrupted"] is True
    s = data["summary"]
    not_sent = s.get("not_sent", 0)
    assert s["completed"] > 0, s
    assert s["completed"] + s["failed"] + not_sent == N, s
    assert len(data["requests"]) == s["completed"] + s["failed"]
    assert set(s["error_types"]) <= {"interrupted"}, s["error_types"]  # nothing else failed
    assert data["config"]["num_requests"] == N
    for r in data["requests"]:
        if r["error"] is None:
            assert r["output_tokens"] >= 1 and r["e2el_ms"] is not None
        else:
            assert r["error_type"] == "interrupted"
    return data


# ---- one signal: stop, drain, write the result ------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_one_signal_writes_an_interrupted_result(tmp_path, sig):
    """SIGHUP (issue 37: the terminal closed, an ssh session dropped) killed the run with
    nothing written; it stops it as SIGTERM does."""
    run = _Run(tmp_path)
    run.wait_for_progress()
    t = time.monotonic()
    run.proc.send_signal(sig)
    rc, stdout, stderr = run.finish()
    elapsed = time.monotonic() - t

    assert f"cbbench: {sig.name}: stopping" in stderr, stderr
    assert "Traceback" not in stderr
    data = _check_interrupted_result(run.out)
    s = data["summary"]
    # The documented exit code: the run's verdict on what it wrote (see the module docstring).
    if s["failed"]:
        assert rc == 1, (rc, stderr)
        assert f"{s['failed']} of {s['completed'] + s['failed']} requests failed" in stderr
    else:
        assert rc == 0, (rc, stderr)
    assert f"result: {run.out}" in stdout
    assert "INTERRUPTED: the figures cover only what finished." in stdout
    assert _leftovers(run.out_dir) == []
    # Stopped well before the ~8 s of arrivals plus the full run, bounded by the grace.
    assert elapsed < EXIT_TIMEOUT_S


@pytest.mark.slow
def test_a_closed_terminal_costs_the_live_view_not_the_result(tmp_path):
    """Issue 37: the terminal closed mid-run (the pty's other end gone, no signal): the panel's
    next write failed with EIO and the run ended in a rich traceback with no result. Now the
    view stops drawing and the run goes on to write its whole result."""
    run = _Run(tmp_path)
    run.wait_for_progress()
    os.close(run._master)  # the terminal is gone: every write to it fails from now on
    try:
        run.proc.wait(timeout=EXIT_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail("cbbench did not finish after its terminal closed")
    data = to_dict(read_run(run.out))
    s = data["summary"]
    assert data["interrupted"] is False and s["completed"] + s["failed"] == N, s
    assert _leftovers(run.out_dir) == []


@pytest.mark.slow
def test_max_error_rate_1_makes_an_interrupted_run_exit_0(tmp_path):
    run = _Run(tmp_path, "--max-error-rate", "1")
    run.wait_for_progress()
    run.proc.send_signal(signal.SIGTERM)
    rc, _, stderr = run.finish()
    assert rc == 0, stderr
    _check_interrupted_result(run.out)
    assert _leftovers(run.out_dir) == []


# ---- a second signal: exit 130 at once --------------------------------------------------------
@pytest.mark.slow
def test_second_sigint_exits_130_promptly_and_leaves_no_partial_file(tmp_path):
    # Some long outputs: the drain after the first signal would run the whole 10 s grace.
    run = _Run(tmp_path, long_every=2)
    run.wait_for_progress()
    run.proc.send_signal(signal.SIGINT)
    # The second signal only once the first was handled (two signals within one long C call
    # would reach Python's handler as one).
    run.wait_for(lambda: "SIGINT: stopping" in run.stderr, 60, "the first signal's message")
    t = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    rc, _, stderr = run.finish(timeout=60)
    elapsed = time.monotonic() - t

    assert rc == 130, (rc, stderr)
    assert "Traceback" not in stderr
    assert elapsed < 10, f"took {elapsed:.1f} s to exit after the second signal"
    # Either no result or a whole, valid one; never a partial or temporary file.
    if run.out.exists():
        read_run(run.out)
    assert _leftovers(run.out_dir) == []


def test_second_signal_says_interrupted(tmp_path, monkeypatch, capsys):
    import cbbench.cli.run as cmd_run
    from cbbench.cli.app import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what StopSignal raises on the second signal

    monkeypatch.setattr("cbbench.bench.runner.execute_run", interrupted)
    monkeypatch.setattr(cmd_run, "StopSignal", lambda: _StopAfter(10**9))
    monkeypatch.setattr(sys, "argv", ["cbbench", "run", "--engine", "sim", "--num-requests", "5",
                                      "--output", str(tmp_path / "x.json")])
    exits = _record_exit_now(monkeypatch)
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        gc.enable()
    assert exc.value.code == 130
    assert "cbbench: interrupted" in capsys.readouterr().err
    # It leaves through os._exit with the collector off: no interpreter teardown, whose
    # collection of the interrupted engine's torch objects once died with SIGABRT in CI.
    assert exits == [(130, False)]


def test_other_exits_keep_the_interpreters_teardown(tmp_path, monkeypatch):
    from cbbench.cli.app import main

    monkeypatch.setattr(sys, "argv", ["cbbench", "run", "--engine", "sim", "--num-requests", "-1"])
    exits = _record_exit_now(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and exits == [] and gc.isenabled()


def _record_exit_now(monkeypatch) -> list[tuple[int, bool]]:
    """os._exit replaced (the real one would end the test process): each call's code and
    whether the collector was on, then SystemExit as the test's stand-in for leaving."""
    calls: list[tuple[int, bool]] = []

    def exit_now(code: int) -> None:
        calls.append((code, gc.isenabled()))
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    return calls


# ---- the simulated engine, through the Python API ----------------------------------------------
class _StopAfter:
    """should_stop that turns true after ``n`` calls (run_until_done asks once per loop)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.n

    # Stands in for interrupts.StopSignal in cmd_run.
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _sim_spec(num_requests: int = 300, rate: float = 20.0):
    from helpers import run_spec

    from cbbench.engine.args import EngineArgs

    return run_spec(
        workload="sharegpt", num_requests=num_requests, seed=3, request_rate=rate,
        engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b"),
    )


def test_interrupted_sim_run_produces_a_valid_result(tmp_path):
    from cbbench.analysis.result import write_result
    from cbbench.bench.runner import execute_run

    stop = _StopAfter(400)
    result = execute_run(_sim_spec(), should_stop=stop)
    assert stop.calls > 400
    assert result.interrupted is True
    s = result.summary
    assert s.completed is not None and s.failed is not None
    assert s.completed > 0
    assert (s.not_sent or 0) > 0  # arrivals after the stop were never sent
    assert s.completed + s.failed + (s.not_sent or 0) == 300
    # The simulated drain finishes every in-flight request well inside the grace period.
    assert s.failed == 0, s.error_types
    path = tmp_path / "sim.json"
    write_result(path, result)
    data = read_run(path)
    assert data.interrupted is True and to_dict(data.summary) == to_dict(s)
    assert [p.name for p in tmp_path.iterdir()] == ["sim.json"]


def test_sim_run_stopped_before_the_first_step(tmp_path):
    from cbbench.bench.runner import execute_run

    result = execute_run(_sim_spec(50, rate=float("inf")), should_stop=lambda: True)
    s = result.summary
    assert result.interrupted is True
    assert s.completed == 0 and s.failed == 0 and s.not_sent == 50
    assert result.requests == [] and s.duration_s == 0


def test_cancelled_requests_decide_the_exit_code_in_process(tmp_path, monkeypatch):
    """With no grace left, in-flight requests are cancelled (error_type interrupted) and count
    against --max-error-rate: exit 1 after writing the result; --max-error-rate 1: exit 0."""
    from typer.testing import CliRunner

    import cbbench.cli.run as cmd_run
    import cbbench.targets.engine as et
    from cbbench.cli.app import app

    drain = et._drain
    monkeypatch.setattr(et, "_drain", lambda engine, grace_s: drain(engine, 0.0))
    args = ["run", "--engine", "sim", "--num-requests", "200", "--request-rate", "inf"]
    for extra, code in (([], 1), (["--max-error-rate", "1"], 0)):
        monkeypatch.setattr(cmd_run, "StopSignal", lambda: _StopAfter(5))
        out = tmp_path / f"r{code}.json"
        res = CliRunner().invoke(app, [*args, *extra, "--output", str(out)])
        assert res.exit_code == code, res.output
        data = to_dict(read_run(out))
        s = data["summary"]
        assert data["interrupted"] is True
        assert s["failed"] > 0 and s["error_types"] == {"interrupted": s["failed"]}
        assert s["completed"] + s["failed"] + s.get("not_sent", 0) == 200
        if code:
            assert "requests failed" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0.json", "r1.json"]


# ---- StopSignal itself ------------------------------------------------------------------------
def test_stop_signal_first_sets_the_flag_second_raises_and_handlers_are_restored(capfd):
    from cbbench.load.interrupts import StopSignal

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with StopSignal() as stop:
        assert not stop()
        signal.raise_signal(signal.SIGTERM)
        assert stop()
        assert "SIGTERM: stopping" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_while_the_result_is_written_keeps_it(tmp_path, monkeypatch):
    """A Ctrl-C after the run, while its result was being written: the run's handler was gone,
    so a KeyboardInterrupt rose inside pydantic's serializer (a traceback, once in CI) and the
    finished run's result was lost. The handler now covers the write: the signal is noted and
    the result written whole."""
    from helpers import cli_in_process

    import cbbench.analysis.result as result_module

    real = result_module.write_result

    def write_after_a_sigint(path, result):
        os.kill(os.getpid(), signal.SIGINT)  # delivered before the write begins
        real(path, result)

    monkeypatch.setattr(result_module, "write_result", write_after_a_sigint)
    out = tmp_path / "x.json"
    outcome = cli_in_process(["run", "--engine", "sim", "--num-requests", "5", "--output",
                              str(out)])
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.returncode == 0, outcome.stderr
    assert read_run(out).summary.completed == 5


def _twice_after_the_first_replace(monkeypatch):
    """os.replace that, once the first file is in place, gets Ctrl-C twice (the second is the
    one that quits): the moment between one file of a set and the next."""
    real, calls = os.replace, []

    def replace(src, dst):
        real(src, dst)
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace)


def test_ctrl_c_twice_between_a_result_and_its_export_leaves_all_or_none(tmp_path, monkeypatch):
    """`run --output-format csv` writes x.json, x.csv and x_summary.csv. Found in the tenth
    review: a second Ctrl-C after x.json was in place left it without its CSVs (or beside a
    previous run's). The three are replaced together, with the signals held for those few
    renames: every file or none, and no temporary file."""
    from helpers import cli_in_process

    _twice_after_the_first_replace(monkeypatch)
    out = tmp_path / "x.json"
    outcome = cli_in_process(["run", "--engine", "sim", "--num-requests", "5", "--output",
                              str(out), "--output-format", "csv"])
    assert "Traceback" not in outcome.stderr, outcome.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names in ([], ["x.csv", "x.json", "x_summary.csv"]), (names, outcome.stderr)
    if names:
        rows = (tmp_path / "x.csv").read_text().strip().splitlines()[1:]
        assert len(rows) == read_run(out).summary.completed == 5


def test_ctrl_c_while_an_export_is_staged_leaves_no_temporary_file(tmp_path, monkeypatch):
    """`cbbench export --format csv` stopped by Ctrl-C while its files were being written: the
    first one's temporary file was left behind (only an OSError cleaned them up)."""
    from helpers import cli_in_process

    result = tmp_path / "r.json"
    assert cli_in_process(["run", "--engine", "sim", "--num-requests", "5", "--output",
                           str(result), "--quiet"]).returncode == 0
    real, synced = os.fsync, []

    def fsync(fd):
        synced.append(fd)
        if len(synced) == 2:  # the second file of the pair
            raise KeyboardInterrupt
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    outcome = cli_in_process(["export", str(result), "--format", "csv"])
    assert outcome.returncode == 130 and "Traceback" not in outcome.stderr, outcome.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_ctrl_c_twice_between_a_sweep_point_and_sweep_json_leaves_both_or_neither(
        tmp_path, monkeypatch):
    """`sweep` saves each point's rate-R.json, then sweep.json listing it. Found in the tenth
    review: a second Ctrl-C between the two left rate-4.json that no sweep.json listed (no
    sweep.json at all after the first point). The pair is replaced together."""
    from helpers import cli_in_process

    _twice_after_the_first_replace(monkeypatch)
    out = tmp_path / "sw"
    outcome = cli_in_process(["sweep", "--engine", "sim", "--num-requests", "5",
                              "--min-duration", "0", "--rates", "4", "--out-dir", str(out)])
    assert "Traceback" not in outcome.stderr, outcome.stderr
    names = sorted(p.name for p in out.iterdir() if p.suffix == ".json" or ".tmp" in p.name)
    assert names in ([], ["rate-4.json", "sweep.json"]), (names, outcome.stderr)
    if names:
        listed = [p["file"] for p in json.loads((out / "sweep.json").read_text())["points"]]
        assert listed == ["rate-4.json"]


def test_ctrl_c_inside_pydantics_serializer_is_an_interrupt(tmp_path, monkeypatch):
    """Found in the tenth review: Ctrl-C 4 s into `cbbench export big.json --format csv` (a
    20,000-request result) landed in pydantic's serializer, which wraps a KeyboardInterrupt
    into PydanticSerializationError (no cause to follow): a traceback and exit 1. Any
    command (export, import, report, compare) now says `cbbench: interrupted` and exits 130."""
    from helpers import cli_in_process
    from pydantic import BaseModel, field_serializer

    class Dumped(BaseModel):
        a: int = 0

        @field_serializer("a")
        def _ctrl_c(self, value):
            raise KeyboardInterrupt  # where the signal's handler raised it

    def render(*args):
        return Dumped().model_dump()

    result = tmp_path / "r.json"
    assert cli_in_process(["run", "--engine", "sim", "--num-requests", "5", "--output",
                           str(result), "--quiet"]).returncode == 0
    monkeypatch.setattr("cbbench.export.files.render", render)
    outcome = cli_in_process(["export", str(result), "--format", "csv"])
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.returncode == 130 and "cbbench: interrupted" in outcome.stderr
