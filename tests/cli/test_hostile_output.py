"""Where results go (issue 19): nothing the user ran is lost, and no file but the output is
touched.

- A full filesystem (a 64 KiB tmpfs, filled): every command that writes fails its write with one
  line and exit 2, leaves the old file whole and no partial or temporary file; `run` prints its
  summary first, so the measurements are not lost; `gate` does not print "passed" first.
- Output kinds: a regular file (or a new one) is replaced atomically; a symlink's target is
  written (the link stays); a device or FIFO is written into, never replaced; `-` is stdout.
- An output that is also one of the command's inputs is refused before anything runs.

Mounting a tmpfs needs root (or CAP_SYS_ADMIN); those tests skip with the reason otherwise. The
device-node cases make their own nodes with mknod (root too): never the machine's /dev/null.
Every case runs `cbbench` as its console script does, in this process (helpers.cli_in_process:
the script's entry, its status, stdout and stderr; tests/cli/test_bad_input.py holds real
processes to the same bytes), but `serve`, a real process: were its check missing, it would
serve for ever, and a process has a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import cli_in_process

CBBENCH = shutil.which("cbbench")
COMMAND = [CBBENCH] if CBBENCH else [sys.executable, "-c", "from cbbench.cli.app import main; main()"]

SIM = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--num-requests", "5"]
RUN = ["run", *SIM]
TMPFS_BYTES = 64 * 1024
OLD = "the old result: must survive a failed write\n"
NO_SPACE = "No space left on device"
FIFO_TIMEOUT_S = 120.0


def _env() -> dict:
    return dict(os.environ, CUDA_VISIBLE_DEVICES="", COLUMNS="200")


def run_cli(argv: list[str], cwd: Path, timeout: float = 300):
    """`cbbench ARGV` in ``cwd``: in this process, but serve in a real one (``timeout``)."""
    if argv[0] == "serve":
        return subprocess.run([*COMMAND, *argv], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=_env())
    return cli_in_process(argv, cwd=cwd, env={"CUDA_VISIBLE_DEVICES": "", "COLUMNS": "200"})


def assert_one_error_line(proc, *texts: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("cbbench: error:")]
    assert len(errors) == 1, proc.stderr
    for t in texts:
        assert t in errors[0], (t, errors[0])
    return errors[0]


def _fill(folder: Path) -> None:
    """Fill the filesystem of ``folder`` to the last byte."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


@pytest.fixture(scope="module")
def full_fs(tmp_path_factory):
    """A 64 KiB tmpfs holding one old file per case, then filled to the last byte."""
    mnt = tmp_path_factory.mktemp("full")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        for name in ("run", "gate", "report", "sweep", "compare", "capacity"):
            (mnt / name).mkdir()
        (mnt / "run" / "res.json").write_text(OLD)
        (mnt / "gate" / "junit.xml").write_text(OLD)
        (mnt / "capacity" / "cap.json").write_text(OLD)
        _fill(mnt)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Two small real results and a workload file."""
    d = tmp_path_factory.mktemp("inputs")
    for name in ("a", "b"):
        proc = run_cli([*RUN, "--output", str(d / f"{name}.json")], d)
        assert proc.returncode == 0, proc.stderr
    (d / "w.jsonl").write_text(json.dumps({"prompt_len": 8, "output_len": 4}) + "\n")
    return d


FULL_CASES = {
    "run": [*RUN, "--output", "{f}/run/res.json"],
    "gate": ["gate", "{i}/a.json", "--baseline", "{i}/b.json", "--junit", "{f}/gate/junit.xml"],
    "report": ["report", "{i}/a.json", "{i}/b.json", "--out", "{f}/report/out"],
    "sweep": ["sweep", *SIM, "--rates", "1,2", "--min-duration", "0", "--out-dir",
              "{f}/sweep/out"],
    "compare": ["compare", *SIM, "--variants", "static,continuous", "--out-dir",
                "{f}/compare/out"],
    "capacity": ["capacity", *SIM, "--min-duration", "0", "--slo", "ttft_p99=1000000",
                 "--start-rate", "1", "--out", "{f}/capacity/cap.json"],
}


@pytest.fixture(scope="module")
def full_outcomes(full_fs, inputs):
    return {name: run_cli([a.replace("{f}", str(full_fs)).replace("{i}", str(inputs))
                           for a in argv], inputs)
            for name, argv in FULL_CASES.items()}


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("case", sorted(FULL_CASES))
def test_a_full_disk_is_one_line_exit_2_and_leaves_no_partial_file(full_fs, full_outcomes, case):
    proc = full_outcomes[case]
    assert_one_error_line(proc, NO_SPACE)
    folder = full_fs / case
    left = [f for f in _files(folder) if f not in ("res.json", "junit.xml", "cap.json")]
    for f in left:  # a whole PNG or JSON written before the disk ran out is fine, a torn one not
        data = (folder / f).read_bytes()
        if f.endswith(".png"):
            assert data.endswith(b"IEND\xaeB`\x82"), f"truncated PNG {f}"
        else:
            json.loads(data)
    assert not [f for f in left if ".tmp" in f or f.startswith(".")], left


def test_a_full_disk_keeps_the_old_result_and_prints_the_summary_first(full_fs, full_outcomes):
    proc = full_outcomes["run"]
    assert "completed / failed" in proc.stdout and "5 / 0" in proc.stdout  # the measurements
    assert (full_fs / "run" / "res.json").read_text() == OLD
    assert (full_fs / "capacity" / "cap.json").read_text() == OLD


def test_gate_on_a_full_disk_does_not_say_passed(full_fs, full_outcomes):
    proc = full_outcomes["gate"]
    assert "passed" not in proc.stdout
    assert (full_fs / "gate" / "junit.xml").read_text() == OLD


# ---- output kinds -----------------------------------------------------------------------------
def _mknod(path: Path, major: int, minor: int) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod needs root: cannot make a private device node")


class FifoReader(threading.Thread):
    """Reads a FIFO without blocking on its open, until the writer closes it (or a deadline)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.data = b""

    def run(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        deadline = time.monotonic() + FIFO_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    chunk = None
                if chunk:
                    self.data += chunk
                elif chunk == b"" and self.data:
                    return  # the writer wrote and closed
                else:
                    time.sleep(0.02)
        finally:
            os.close(fd)


def test_output_kinds(tmp_path):
    """Devices, a FIFO, a symlink and stdout, each as --output of one run."""
    null, full, fifo = tmp_path / "null", tmp_path / "full", tmp_path / "fifo"
    _mknod(null, 1, 3)  # what /dev/null is
    _mknod(full, 1, 7)  # what /dev/full is
    os.mkfifo(fifo)
    target = tmp_path / "real" / "target.json"
    target.parent.mkdir()
    target.write_text(OLD)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    reader = FifoReader(fifo)
    reader.start()
    cases = {"null": null, "full": full, "fifo": fifo, "link": link, "stdout": "-"}
    procs = {name: run_cli([*RUN, "--output", str(out)], tmp_path) for name, out in cases.items()}
    reader.join(FIFO_TIMEOUT_S)

    assert procs["null"].returncode == 0, procs["null"].stderr
    assert stat.S_ISCHR(null.lstat().st_mode), "the device node was replaced by a file"

    assert_one_error_line(procs["full"], NO_SPACE, str(full))
    assert "completed / failed" in procs["full"].stdout
    assert stat.S_ISCHR(full.lstat().st_mode), "the device node was replaced by a file"

    assert procs["fifo"].returncode == 0, procs["fifo"].stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode), "the FIFO was replaced by a file"
    assert json.loads(reader.data)["summary"]["completed"] == 5

    assert procs["link"].returncode == 0, procs["link"].stderr
    assert link.is_symlink() and link.resolve() == target
    assert json.loads(target.read_text())["summary"]["completed"] == 5
    assert not [p for p in target.parent.iterdir() if p != target]  # no temporary file

    out = procs["stdout"]
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["summary"]["completed"] == 5  # stdout is the JSON alone
    assert "completed / failed" in out.stderr  # the table went to stderr
    assert not (tmp_path / "-").exists()


# ---- an output that is one of the inputs -------------------------------------------------------
def test_an_output_that_is_an_input_is_refused(tmp_path, inputs):
    d = tmp_path
    for name in ("a.json", "b.json", "w.jsonl"):
        (d / name).write_bytes((inputs / name).read_bytes())
    os.link(d / "w.jsonl", d / "hard.jsonl")
    (d / "soft.json").symlink_to(d / "b.json")
    before = {n: (d / n).read_bytes() for n in ("a.json", "b.json", "w.jsonl")}
    cases = {
        "gate-junit-is-the-baseline": ["gate", "a.json", "--baseline", "b.json", "--junit",
                                       "b.json"],
        "gate-markdown-is-the-new-result-by-symlink": [
            "gate", "b.json", "--baseline", "a.json", "--markdown", "soft.json"],
        "run-output-is-the-workload": [*RUN, "--workload", "w.jsonl", "--output", "w.jsonl"],
        "run-output-is-the-workload-by-hard-link": [
            *RUN, "--workload", "w.jsonl", "--output", "hard.jsonl"],
        "compare-markdown-is-an-input": ["compare", "a.json", "b.json", "--markdown", "a.json"],
        "compare-csv-is-an-input": ["compare", "a.json", "b.json", "--csv", "./b.json"],
    }
    procs = {name: run_cli(argv, d) for name, argv in cases.items()}
    for name, proc in procs.items():
        line = assert_one_error_line(proc, "is also an input")
        assert proc.stdout == "", (name, proc.stdout)
        assert line, name
    assert {n: (d / n).read_bytes() for n in before} == before


def test_a_symlink_loop_as_the_output_is_refused_before_the_run(tmp_path):
    """Found in this round: the loop was found only when the result was written, after the
    whole run."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    proc = run_cli([*RUN, "--output", str(tmp_path / "a")], tmp_path)
    assert_one_error_line(proc, "Too many levels of symbolic links")
    assert proc.stdout == ""  # refused before the run: no summary


# ---- a file output named like a folder ---------------------------------------------------------
TRAILING_SLASH_CASES = {
    "run": [*RUN, "--output", "{d}/newdir/"],
    "gate-junit": ["gate", "{i}/a.json", "--baseline", "{i}/b.json", "--junit", "{d}/newdir/"],
    "compare-csv": ["compare", "{i}/a.json", "{i}/b.json", "--csv", "{d}/newdir/"],
    "capacity": ["capacity", *SIM, "--min-duration", "0", "--slo", "ttft_p99=1000000",
                 "--start-rate", "1", "--out", "{d}/newdir/"],
    "serve-request-log": ["serve", "--engine", "sim", "--request-log", "{d}/newdir/"],
    "calibrate": ["calibrate", "{i}/a.json", "--out", "{d}/newdir/"],
}


@pytest.mark.parametrize("case", sorted(TRAILING_SLASH_CASES))
def test_a_file_output_ending_in_a_slash_is_refused(tmp_path, inputs, case):
    """pathlib drops a trailing '/': `--output newdir/` wrote a regular file named newdir (and
    serve created an empty one), as no careful Unix tool does."""
    argv = [a.replace("{d}", str(tmp_path)).replace("{i}", str(inputs))
            for a in TRAILING_SLASH_CASES[case]]
    proc = run_cli(argv, tmp_path, timeout=120)
    assert_one_error_line(proc, "newdir/", "ends in '/'")
    assert not (tmp_path / "newdir").exists()
