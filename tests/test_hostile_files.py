"""Every JSON file a user names is read by one capped reader (engine/json_file.py): a device
profile, a result too large for memory, a tokenizer_config.json that is a device. Before it,
`--gpu-profile /dev/zero` was a MemoryError traceback, a profile nested 100k brackets deep a
RecursionError, a sparse result file larger than memory was read until the OOM killer came, and
a tokenizer_config.json linked to /dev/zero likewise.

The cases that read without end run in a child whose memory is capped, so a regression fails the
test instead of eating the host.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cbbench.engine.json_file import read_json
from cbbench.engine.memory_check import available_host_bytes

CBBENCH = shutil.which("cbbench")
COMMAND = [CBBENCH] if CBBENCH else [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
SIM = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--num-requests", "2"]
MEMORY_CAP_BYTES = 4 << 30
NESTED = "[" * 100_000 + "]" * 100_000
BIG_INT = "1" * 5000
needs_dev_zero = pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def _cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *argv], capture_output=True, text=True, timeout=120,
                          preexec_fn=_cap_memory, cwd=cwd, env=dict(os.environ, COLUMNS="200"))


def _one_line(proc: subprocess.CompletedProcess, *texts: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), proc.stderr[-2000:]
    for t in texts:
        assert t in lines[0], (t, lines[0])


@pytest.mark.parametrize("content", ["dev-zero", "nested", "big-int", "folder"])
def test_a_gpu_profile_that_is_not_json_is_one_line(tmp_path, content):
    if content == "dev-zero":
        if not Path("/dev/zero").exists():
            pytest.skip("needs /dev/zero")
        path = Path("/dev/zero")
    elif content == "folder":
        path = tmp_path
    else:
        path = tmp_path / "profile.json"
        path.write_text(NESTED if content == "nested" else '{"version": ' + BIG_INT + "}")
    proc = _cli([*SIM, "--gpu-profile", str(path), "--output", str(tmp_path / "r.json")],
                tmp_path)
    _one_line(proc, "--gpu-profile", str(path))
    assert not (tmp_path / "r.json").exists()


def _sparse_beyond_memory(tmp_path: Path) -> Path:
    available = available_host_bytes()
    if available is None:
        pytest.skip("the memory available is unknown here")
    path = tmp_path / "huge.json"
    try:
        with open(path, "wb") as f:
            # Twice memory: ten times the limit, whatever other processes free meanwhile.
            f.truncate(2 * available)  # sparse: no disk used
    except OSError as e:
        pytest.skip(f"cannot make a sparse file here: {e}")
    return path


@pytest.mark.parametrize("command", ["gate", "report"])
def test_a_result_file_beyond_memory_is_refused_before_it_is_read(tmp_path, command):
    huge = _sparse_beyond_memory(tmp_path)
    argv = {"gate": ["gate", str(huge), "--baseline", str(huge)],
            "report": ["report", str(huge), "--out", str(tmp_path / "out")]}[command]
    _one_line(_cli(argv, tmp_path), str(huge), "of memory to read")


def test_the_reader_names_each_problem(tmp_path):
    (tmp_path / "ok.json").write_text('{"a": [1, 2.5, "x"]}')
    assert read_json(tmp_path / "ok.json", "thing") == {"a": [1, 2.5, "x"]}
    (tmp_path / "big.json").write_text("[" + "0," * 600 + "0]")
    cases = {
        tmp_path / "missing.json": "thing not found",
        tmp_path: "Is a directory",
        tmp_path / "big.json": "holds more than",
    }
    for path, text in cases.items():
        with pytest.raises(ValueError, match=text):
            read_json(path, "thing", max_bytes=1000)
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(ValueError, match="cannot read thing"):
        read_json(tmp_path / "latin1.json", "thing")


@needs_dev_zero
def test_a_tokenizer_config_linked_to_dev_zero_means_no_template(tmp_path):
    """The chat-template lookup beside --tokenizer read its tokenizer_config.json whole."""
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").symlink_to("/dev/zero")
    code = ("import sys; from cbbench.load.chat_template import load_chat_template; "
            "print(load_chat_template(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tokenizer.json")],
                          capture_output=True, text=True, timeout=120, preexec_fn=_cap_memory)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr[-2000:]
