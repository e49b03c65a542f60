"""Every numbered command in the README runs as written, in a fresh directory, in README order
(later commands read what earlier ones wrote), and writes what it names.

Two changes only, each a port: `cbbench serve` listens on a free port (`--port 0` put before
the README's arguments) instead of 8000, and `http://localhost:8000` in an endpoint command
becomes that server's address. An endpoint command before the README's first `serve` line
(command 2) runs against that first server, started early.

pytest runs the commands that take seconds; the ones that take minutes on a shared 2-core
machine (named in SLOW, with why) run from the script mode, which .ci/run calls after pytest:

    python tests/cli/test_readme_commands.py --all      # every command; --only N,M for some
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SAMPLES = "docs/examples"  # the README names its sample inputs under this folder of the clone
SECTION = "## The commands you will type most"
NUMBERED = re.compile(r"^#\s*(\d+)\.\s")
ENDPOINT = "http://localhost:8000"
# A flag whose value is a file or folder the command writes (checked to exist afterwards).
WRITES = ("--output", "--out", "--out-dir", "--request-log")
# Exit codes a command may end with besides 0, as its README comment says: `audit` exits 1
# past its tolerance, which a loaded client can cause (its report says so).
ALSO_EXITS = {("audit",): {1}}
# Minutes, not seconds, on a shared 2-core machine: run by the script mode (.ci/run), not pytest.
SLOW = {
    "cbbench run --workload sharegpt --engine sim --gpu h200": "1000 simulated requests: a "
        "minute at load 10",
    "cbbench report": "matplotlib renders every plot",
    "cbbench run --engine sim --output no-spec.json": "1000 simulated requests",
    "cbbench run --engine sim --speculative-tokens": "1000 simulated requests",
    "cbbench compare no-spec.json": "needs the two runs above",
    "cbbench run --engine sim --gpu h100 --disaggregate": "1000 simulated long prompts",
    "cbbench run --endpoint http://localhost:8000 --workload sharegpt --request-rate 8":
        "1000 requests at 8 req/s: over 2 minutes by design",
    "cbbench compare --workload sharegpt": "three 1000-request simulator runs",
    "cbbench sweep": "four 1000-request simulator runs",
    "cbbench capacity": "a search of simulator runs",
    "cbbench run --workload sharegpt --num-requests 300": "a real torch run on the CPU",
    "cbbench calibrate": "needs the CPU run above",
    "cbbench run --engine sim --gpu-profile": "needs the CPU run above",
    "cbbench run --engine sim --num-requests 1000000": "a million simulated requests",
    "cbbench run --endpoint http://localhost:8000 --api responses": "1000 requests in real time",
    "cbbench run --endpoint http://localhost:8000 --api embeddings":
        "800 inputs of ~1k tokens through the simulated H200 in real time",
    "cbbench run --endpoint http://localhost:8000 --api chat --workload random-mm":
        "100 requests of 2 images at 10 req/s",
    "cbbench run --endpoint http://localhost:8000 --api chat --workload agentic-coding":
        "20 agent sessions (tool calls, sub-agents) in real time",
    "cbbench serve --engine sim --enable-per-request-metrics": "only the slow run below uses it",
    "cbbench run --endpoint http://localhost:8000 --server-log": "1000 requests in real time",
    "cbbench run --engine sim --gpu h100 --model gpt-oss-20b": "a 4-replica MoE cluster",
}
COMMAND_TIMEOUT_S = 600.0
SERVE_READY_S = 90.0  # start-up imports on a busy 2-core machine
READY_LINE = re.compile(r"ready at (http://\S+)/v1")


@dataclass(frozen=True)
class Command:
    number: int  # the README's item number
    text: str  # as written (continuations joined)

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def slow(self) -> str | None:
        return next((why for prefix, why in SLOW.items() if self.text.startswith(prefix)), None)


def _executable(argv: list[str]) -> list[str]:
    """`cbbench` as this interpreter's environment installed it (the venv under test), even
    when that venv's bin is not on PATH."""
    beside = Path(sys.executable).parent / argv[0]
    return [str(beside) if beside.exists() else argv[0], *argv[1:]]


def readme_commands(readme: Path = README) -> list[Command]:
    """The commands of the README's numbered section, in order, with their item numbers."""
    text = readme.read_text()
    start = text.index(SECTION)
    block = text[text.index("```bash", start) + len("```bash"):]
    block = block[:block.index("```")]
    out: list[Command] = []
    number = 0
    pending = ""
    for raw in block.splitlines():
        line = raw.strip()
        if pending:
            line = pending + " " + line
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        m = NUMBERED.match(line)
        if m:
            number = int(m.group(1))
        elif line and not line.startswith("#"):
            assert number, f"a README command before the first numbered item: {line}"
            out.append(Command(number, line))
    return out


class Server:
    """One `cbbench serve` from the README, on a free port, stopped when replaced."""

    def __init__(self, argv: list[str], cwd: Path, log: Path):
        self.argv = argv
        self.log = log
        self.out = log.open("w")
        cmd = _executable([argv[0], "serve", "--port", "0", *argv[2:]])
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self.out, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.url = ""
        deadline = time.monotonic() + SERVE_READY_S
        while not self.url:
            m = READY_LINE.search(log.read_text())
            if m:
                self.url = m.group(1)
                break
            assert self.proc.poll() is None, f"cbbench serve exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"serve not ready:\n{log.read_text()}"
            time.sleep(0.2)  # polling a child's log file for its ready line, not synchronizing

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.out.close()


def _written(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in WRITES]


def _show(r: dict) -> None:
    state = r.get("skipped") and f"skipped ({r['skipped']})" or (
        "FAILED" if "error" in r else f"ok rc={r['rc']} {r['s']} s")
    print(f"{r['n']:>2}  {state:<28} {r['command']}", flush=True)
    if "error" in r:
        print(r["error"], flush=True)


def run_commands(commands: list[Command], workdir: Path, skip_slow: bool,
                 show=None) -> list[dict]:
    """Each command in order in ``workdir``; the failures (and what ran) as dicts, each also
    handed to ``show`` as it ends."""
    if (ROOT / SAMPLES).is_dir() and not (workdir / SAMPLES).exists():
        shutil.copytree(ROOT / SAMPLES, workdir / SAMPLES)
    first_serve = next((c for c in commands if c.argv[:2] == ["cbbench", "serve"]), None)
    server: Server | None = None
    rows: list[dict] = []
    try:
        for i, c in enumerate(commands):
            argv = c.argv
            if skip_slow and c.slow:
                rows.append({"n": c.number, "command": c.text, "skipped": c.slow})
                if show:
                    show(rows[-1])
                continue
            if argv[:2] == ["cbbench", "serve"]:
                if server is None or server.argv != argv:
                    if server is not None:
                        server.stop()
                    server = Server(argv, workdir, workdir / f"serve-{i}.log")
                rows.append({"n": c.number, "command": c.text, "rc": 0, "s": 0.0})
                if show:
                    show(rows[-1])
                continue
            if ENDPOINT in c.text:
                if server is None:
                    assert first_serve is not None, "an endpoint command and no serve line"
                    server = Server(first_serve.argv, workdir, workdir / "serve-early.log")
                argv = [a.replace(ENDPOINT, server.url) for a in argv]
            t0 = time.monotonic()
            try:
                p = subprocess.run(_executable(argv), cwd=workdir, capture_output=True,
                                   text=True, timeout=COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired as e:  # one command's failure, not the script's
                p = subprocess.CompletedProcess(argv, -1, str(e.stdout or ""),
                                                f"timed out after {COMMAND_TIMEOUT_S:.0f} s")
            row = {"n": c.number, "command": c.text, "rc": p.returncode,
                   "s": round(time.monotonic() - t0, 1)}
            allowed = {0} | next((v for k, v in ALSO_EXITS.items() if tuple(argv[1:2]) == k),
                                 set())
            missing = [w for w in _written(argv) if not (workdir / w).exists()]
            if p.returncode not in allowed or missing or "Traceback" in p.stderr:
                row["error"] = (f"exit {p.returncode}, missing {missing}\n"
                                f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            rows.append(row)
            if show:
                show(row)
    finally:
        if server is not None:
            server.stop()
    return rows


def test_the_readme_has_its_numbered_commands():
    commands = readme_commands()
    numbers = sorted({c.number for c in commands})
    assert numbers == list(range(1, numbers[-1] + 1)) and numbers[-1] >= 16, numbers
    assert all(c.argv[0] == "cbbench" for c in commands), [c.text for c in commands]
    # Every SLOW entry still names a README command (a renamed one would run nowhere).
    for prefix in SLOW:
        assert any(c.text.startswith(prefix) for c in commands), prefix


def test_the_readme_names_only_files_that_exist_or_an_earlier_command_writes():
    """An input file a command names (a JSON or JSONL argument) ships with the clone or is
    written by a command before it: what `mixed.jsonl` and `vllm_result.json` lacked."""
    written: set[str] = set()
    for c in readme_commands():
        argv = c.argv
        for a in argv[1:]:
            if a.endswith((".json", ".jsonl")) and a not in _written(argv) and a not in written:
                assert (ROOT / a).is_file(), f"README command {c.number} reads {a}: no such file"
        written.update(_written(argv))


def test_the_readme_commands_run_as_written(tmp_path):
    """The commands that take seconds (the others: the script mode, from .ci/run)."""
    rows = run_commands(readme_commands(), tmp_path, skip_slow=True)
    failed = [r for r in rows if "error" in r]
    assert not failed, "\n\n".join(f"README {r['n']}: {r['command']}\n{r['error']}"
                                   for r in failed)
    assert sum("rc" in r for r in rows) >= 8  # the quick half of the README ran here


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="the slow commands too")
    ap.add_argument("--only", default="", help="README item numbers, e.g. 1,5,6")
    ap.add_argument("--dir", default="", help="work here (default: a fresh temp folder)")
    args = ap.parse_args()
    commands = readme_commands()
    if args.only:
        keep = {int(x) for x in args.only.split(",")}
        commands = [c for c in commands if c.number in keep]
    import tempfile

    with contextlib.ExitStack() as stack:
        workdir = Path(args.dir) if args.dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="cbbench-readme-")))
        workdir.mkdir(parents=True, exist_ok=True)
        rows = run_commands(commands, workdir, skip_slow=not args.all, show=_show)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
