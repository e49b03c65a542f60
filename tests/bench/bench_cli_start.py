"""The CPU seconds of a whole `cbbench` process, for the commands the test suite and users start
most (issue 36 item 5: the suite starts a few hundred; issue 41 item 2: start fast): the help, a
mistyped command, a command's missing argument, a bad flag value, and a 3-request simulated run.

    python tests/bench/bench_cli_start.py [--runs 5] [--against REV]

CPU is the process's user + system time (os.wait4), which a loaded machine inflates far less than
the wall time. Two starts: the modules' bytecode cached (a temporary PYTHONPYCACHEPREFIX, filled
by an uncounted run first, as an installed package runs) and PYTHONDONTWRITEBYTECODE=1 (a source
tree's cbbench compiled on every start, as in sandboxes that set it). --against REV: the same
for a commit (bench_loadgen_ab's venv of it), the sides alternated run by run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import bench_loadgen_ab as ab  # tests/bench/, beside this file

CLI = "from cbbench.cli.app import main; main()"
# name -> (argv, the exit code it must end with)
COMMANDS: dict[str, tuple[list[str], int]] = {
    "--help": (["--help"], 0),
    "rnu (a typo: every command registered)": (["rnu"], 2),
    "audit (no arguments)": (["audit"], 2),
    "run --num-requests x": (["run", "--num-requests", "x"], 2),
    "run --engine sim (3 requests)": (
        ["run", "--engine", "sim", "--workload", "random", "--input-len", "16", "--output-len",
         "4", "--num-requests", "3", "--output", "r.json"], 0),
}


def _cpu(python: str, argv: list[str], want: int, env: dict[str, str], cwd: Path) -> float:
    """User + system CPU seconds of one `cbbench ARGV` process."""
    proc = subprocess.Popen([python, "-c", CLI, *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, cwd=cwd)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != want:
        raise SystemExit(f"cbbench {' '.join(argv)} exited {proc.returncode}, not {want}:\n"
                         f"{err.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--against", help="a commit to measure beside this tree")
    args = ap.parse_args()

    sides = ab.start_sides(args.against)
    print(f"# {ab._uptime()}")
    print("| command | side | start | CPU s (median) | runs |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="cbbench-cli-start-") as tmp:
        work = Path(tmp)
        starts = ab.start_envs(work, "not cached")
        for how, env in starts.items():
            for name, (argv, want) in COMMANDS.items():
                if how == "bytecode cached":  # fill the cache: not counted
                    for python in sides.values():
                        _cpu(python, argv, want, env, work)
                got: dict[str, list[float]] = {label: [] for label in sides}
                for _ in range(args.runs):
                    for label, python in sides.items():
                        got[label].append(_cpu(python, argv, want, env, work))
                for label, runs in got.items():
                    print(f"| {name} | {label} | {how} | {statistics.median(runs):.3f} | "
                          + ", ".join(f"{c:.2f}" for c in runs) + " |", flush=True)
    print(f"# {ab._uptime()}")


if __name__ == "__main__":
    main()
