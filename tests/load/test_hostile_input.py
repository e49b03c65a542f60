"""Hostile workload files and start-up interrupts (issue 19).

- Valid JSONL is read as JSONL: lines end at \\n only (\\r\\n accepted); U+2028, U+2029 and
  U+0085 inside strings are text (str.splitlines() cut lines there).
- A file that is not JSONL fails with one line naming the line: nested 100k brackets deep (a
  RecursionError before), a line longer than MAX_LINE_BYTES (`--workload /dev/zero` read until
  out of memory).
- A FIFO with no writer as the workload: SIGTERM stops cbbench (it was ignored until SIGKILL);
  Ctrl-C at any moment of start-up exits without a traceback.
- Fields that disagree are refused instead of one silently winning: `arrival_s` on only some
  lines (every timestamp was dropped), `prompt` with `prompt_len`.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import invoke_app, wait_until

from cbbench.errors import UsageError
from cbbench.load.jsonl import MAX_LINE_BYTES
from cbbench.load.workload import load_jsonl

CBBENCH = shutil.which("cbbench")
COMMAND = [CBBENCH] if CBBENCH else [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
SIM = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--num-requests", "2"]
MEMORY_CAP_BYTES = 4 << 30  # a child that reads without end fails instead of eating the host


def _write(tmp_path: Path, text: str, name: str = "w.jsonl") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


# ---- valid JSONL -----------------------------------------------------------------------------
@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c"])
def test_unicode_line_separators_inside_strings_are_text(tmp_path, sep):
    prompt = f"first line{sep}second line"
    lines = [json.dumps({"prompt": prompt, "output_len": 2}, ensure_ascii=False),
             json.dumps({"prompt_len": 4, "output_len": 2})]
    w = load_jsonl(_write(tmp_path, "\n".join(lines) + "\n"))
    assert len(w.requests) == 2 and w.requests[0].prompt == prompt


def test_crlf_line_endings_are_accepted(tmp_path):
    text = "\r\n".join(json.dumps({"prompt_len": 4 + i, "output_len": 2}) for i in range(3))
    w = load_jsonl(_write(tmp_path, text + "\r\n\r\n"))
    assert [r.prompt_len for r in w.requests] == [4, 5, 6]


def test_errors_still_name_the_line_after_a_separator_in_a_string(tmp_path):
    lines = [json.dumps({"prompt": "a\u2028b", "output_len": 2}, ensure_ascii=False), "{oops"]
    with pytest.raises(UsageError, match=r"w.jsonl:2: malformed JSON"):
        load_jsonl(_write(tmp_path, "\n".join(lines) + "\n"))


# ---- files that are not JSONL ------------------------------------------------------------------
def test_json_nested_too_deep_is_one_line(tmp_path):
    p = _write(tmp_path, json.dumps({"prompt_len": 4, "output_len": 2}) + "\n"
               + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UsageError, match=r"w.jsonl:2: .*nested too deeply"):
        load_jsonl(p)


def test_a_line_beyond_the_limit_is_refused(tmp_path):
    p = _write(tmp_path, '{"prompt": "' + "a" * (MAX_LINE_BYTES + 10) + '", "output_len": 2}\n')
    with pytest.raises(UsageError, match=r"w.jsonl:1: the line is longer than"):
        load_jsonl(p)


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_dev_zero_as_the_workload_is_one_line(tmp_path):
    proc = subprocess.run([*COMMAND, *SIM, "--workload", "/dev/zero", "--output",
                           str(tmp_path / "x.json")], capture_output=True, text=True,
                          timeout=120, preexec_fn=_cap_memory, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("cbbench: error: ") and "longer than" in proc.stderr


# ---- fields that disagree ----------------------------------------------------------------------
def test_arrival_s_on_only_some_lines_is_refused(tmp_path):
    lines = [json.dumps({"prompt_len": 4, "output_len": 2, "arrival_s": 0.5}),
             json.dumps({"prompt_len": 4, "output_len": 2}),
             json.dumps({"prompt_len": 4, "output_len": 2, "arrival_s": 1.5})]
    with pytest.raises(UsageError, match=r"2 of 3 requests have 'arrival_s'.*line 2"):
        load_jsonl(_write(tmp_path, "\n".join(lines) + "\n"))


def test_prompt_with_prompt_len_is_refused(tmp_path):
    line = json.dumps({"prompt": "a b c", "prompt_len": 50, "output_len": 2})
    with pytest.raises(UsageError, match=r"w.jsonl:1: give 'prompt' or 'prompt_len', not both"):
        load_jsonl(_write(tmp_path, line + "\n"))


# ---- signals before the run starts -------------------------------------------------------------
def _popen(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([*COMMAND, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _mapped_from_site_packages(pid: int) -> bool:
    """Whether ``pid`` has loaded a compiled module from site-packages."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # it has exited
        return True
    return any("site-packages" in line and ".so" in line for line in maps.splitlines())


def _blocked_in_open(pid: int, timeout: float) -> bool:
    """Whether ``pid`` is blocked opening a FIFO (the kernel waits for a writer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/wchan") as f:
                if "wait_for_partner" in f.read():
                    return True
        except OSError:
            return False
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_sigterm_stops_a_run_waiting_on_a_fifo_workload(tmp_path):
    fifo = tmp_path / "w.jsonl"
    os.mkfifo(fifo)
    proc = _popen([*SIM, "--workload", str(fifo), "--output", str(tmp_path / "x.json")], tmp_path)
    try:
        if not _blocked_in_open(proc.pid, 60):
            time.sleep(5)  # no /proc/PID/wchan here: give start-up time to reach the FIFO
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("SIGTERM did not stop cbbench waiting on a FIFO")
    assert proc.returncode in (130, -signal.SIGTERM), err
    assert "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def _wait_for_mapping(pid: int, name: str, timeout: float) -> bool:
    """Whether ``pid`` mapped a file whose path holds ``name`` (a module being imported)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if name in f.read():
                    return True
        except OSError:
            return False
        time.sleep(0.002)
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/PID/maps")
def test_ctrl_c_while_importing_prints_no_traceback(tmp_path):
    """The command imports numpy early and typer, rich and its commands after: a signal the
    moment numpy's extension is mapped lands inside the imports, before main() runs."""
    proc = _popen([*SIM, "--output", str(tmp_path / "x.json")], tmp_path)
    assert _wait_for_mapping(proc.pid, "_multiarray_umath", 60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode in (130, -signal.SIGINT), err
    assert "cbbench: interrupted" in err


@pytest.mark.parametrize("delay", [0.4, 0.8, 1.5])
def test_ctrl_c_during_start_up_prints_no_traceback(tmp_path, delay):
    """At any moment before the run starts (imports, loading the workload, building the
    engine): no traceback, exit 130 (or killed by SIGINT before Python handles signals)."""
    started = time.monotonic()
    proc = _popen([*SIM, "--output", str(tmp_path / "x.json")], tmp_path)
    # Not before the interpreter's own start-up is over: a SIGINT inside `site` (the venv's
    # .pth files) is CPython's fatal error with its traceback, before any cbbench code runs,
    # and a loaded host can stretch that past 0.4 s. The first compiled module from
    # site-packages (pydantic's or numpy's, which cbbench's imports load) marks it over.
    wait_until(lambda: proc.poll() is not None or _mapped_from_site_packages(proc.pid), 60,
               "the child to get past the interpreter's start-up")
    time.sleep(max(0.0, delay - (time.monotonic() - started)))  # the moment the case names
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode in (0, 130, -signal.SIGINT), err


# ---- JSON that Python's parser chokes on, in every file cbbench reads --------------------------
NESTED = "[" * 100_000 + "]" * 100_000
BIG_INT = "1" * 5000  # beyond Python's 4300-digit int() limit: a ValueError, not a JSONDecodeError


def _result_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def good_result(tmp_path_factory) -> Path:
    from helpers import run_spec

    from cbbench.analysis.result import write_result
    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    p = tmp_path_factory.mktemp("good") / "good.json"
    write_result(p, execute_run(run_spec(workload="sharegpt", num_requests=3,
                                        engine=EngineArgs(engine="sim"))))
    return p


def _argv(command: str, bad: Path, good: Path, tmp_path: Path) -> list[str]:
    return {"gate": ["gate", str(bad), "--baseline", str(good)],
            "compare": ["compare", str(good), str(bad)],
            "report": ["report", str(bad), "--out", str(tmp_path / "out")]}[command]


@pytest.mark.parametrize("command", ["gate", "compare", "report"])
@pytest.mark.parametrize("content", ["nested", "big-int"])
def test_a_result_file_that_breaks_the_json_parser_is_one_line(tmp_path, good_result, command,
                                                               content):

    text = NESTED if content == "nested" else '{"schema_version": 1, "x": ' + BIG_INT + "}"
    bad = _result_file(tmp_path, text)
    res = invoke_app(_argv(command, bad, good_result, tmp_path),
                     env={"COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(err) == 1 and str(bad) in err[0], res.stderr


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("command", ["gate", "report"])
def test_dev_zero_as_a_result_file_is_one_line(tmp_path, good_result, command):
    """A subprocess with its memory capped: the read was unbounded (an OOM kill)."""
    proc = subprocess.run([*COMMAND, *_argv(command, Path("/dev/zero"), good_result, tmp_path)],
                          capture_output=True, text=True, timeout=120, preexec_fn=_cap_memory,
                          cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("cbbench: error: ")
    assert "/dev/zero" in proc.stderr


@pytest.mark.parametrize("line", [
    '{"prompt_len": ' + BIG_INT + ', "output_len": 2}',
    '{"turns": ' + NESTED + "}",
])
def test_a_jsonl_line_that_breaks_the_json_parser_is_one_line(tmp_path, line):
    with pytest.raises(UsageError, match=r"w.jsonl:1: "):
        load_jsonl(_write(tmp_path, line + "\n"))


def test_a_mooncake_trace_reads_lines_as_jsonl(tmp_path):
    """The Mooncake loader split with str.splitlines() too, and choked like the rest."""
    from cbbench.load.workload import load_workload

    row = {"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1]}
    ok = dict(row, note="a\u2028b")  # an extra field holding a line separator
    text = json.dumps(row) + "\n" + json.dumps(ok, ensure_ascii=False) + "\r\n"
    w = load_workload(str(_write(tmp_path, text, "trace.jsonl")))
    assert len(w.requests) == 2
    bad = json.dumps(row) + "\n" + '{"timestamp": ' + BIG_INT + "}\n"
    with pytest.raises(UsageError, match=r"trace.jsonl:2: "):
        load_workload(str(_write(tmp_path, bad, "trace.jsonl")))


# ---- --tokenizer: a file or its folder, nothing else ---------------------------------------------
@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_dev_zero_as_the_tokenizer_is_one_line(tmp_path):
    """The tokenizers library read /dev/zero until the OOM killer came (the child's memory is
    capped here)."""
    pytest.importorskip("tokenizers")
    proc = subprocess.run(
        [*COMMAND, "run", "--endpoint", "http://127.0.0.1:1", "--served-model", "x",
         "--num-requests", "2", "--tokenizer", "/dev/zero", "--output", str(tmp_path / "x.json")],
        capture_output=True, text=True, timeout=120, preexec_fn=_cap_memory, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("cbbench: error: ") and "tokenizer" in proc.stderr
    assert "out of memory" not in proc.stderr  # refused for what it is, not for its size


@pytest.mark.parametrize("content", ["[1, 2]", "[" * 100_000 + "]" * 100_000, '"text"'])
def test_a_tokenizer_config_that_is_not_an_object_means_no_template(tmp_path, content):
    from cbbench.load.chat_template import load_chat_template

    (tmp_path / "tokenizer_config.json").write_text(content)
    assert load_chat_template(str(tmp_path / "tokenizer.json")) is None


@pytest.mark.parametrize("line", [
    '{"prompt": "a \\ud800 b", "output_len": 2}',
    '{"turns": [{"user": "hi \\udfff", "output_len": 2}]}',
])
def test_a_lone_surrogate_in_a_prompt_is_one_line(tmp_path, line):
    """json.loads takes "\\ud800"; a tokenizer then raised TypeError, and no HTTP body can
    carry it."""
    with pytest.raises(UsageError, match=r"w.jsonl:1\b.*not valid Unicode"):
        load_jsonl(_write(tmp_path, line + "\n"), count_tokens=lambda s: len(s.encode()))
