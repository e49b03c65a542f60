"""From the `cbbench run` command to its first streamed request (issue 41, item 2): the wall
seconds, and the CPU seconds the process spent before it (imports, option checks, the
workload, the pool), which a loaded machine does not inflate the way it inflates the wall
time (on 2 cores shared by many processes the wall time is mostly waiting for a core).

    python tests/bench/bench_start.py [--runs 4] [--against REV]

Against tests/timing_server.py; `cbbench run --endpoint URL --served-model M --workload random
--input-len 16 --output-len 16 --num-requests 20 --request-rate 100`. The CPU is read inside the
process when stream_pool.StreamConnection.start first writes a request (patched as the module
is imported, nothing preloaded). Two starts: the modules' bytecode cached (as an installed
package runs; a temporary PYTHONPYCACHEPREFIX, filled by an uncounted run first) and
PYTHONDONTWRITEBYTECODE=1 (the installed packages' own bytecode read, a source tree's cbbench
compiled on every start where it never kept any: this sandbox's editable checkouts). --against REV: the same for a commit
(bench_loadgen_ab's venv of it), the sides alternated.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_loadgen_ab as ab  # tests/bench/, beside this file

# Run as `python -c HOOK cbbench run ...`: times the first send, then runs the CLI.
HOOK = r"""
import importlib.machinery, os, sys, time
marks = []
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "cbbench.targets.stream_pool":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader.exec_module
        def exec_module(mod):
            real(mod)
            orig = mod.StreamConnection.start
            def start(self, ex, data):
                if not marks:
                    t = os.times()
                    marks.append((t.user + t.system, time.time()))
                return orig(self, ex, data)
            mod.StreamConnection.start = start
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Finder())
sys.argv = sys.argv[1:]
try:
    from cbbench.cli.app import main
    main()
finally:
    with open(os.environ["CBBENCH_BENCH_MARKS"], "w") as f:
        f.write("%.3f %.6f" % marks[0] if marks else "")
"""


def _one(python: str, url: str, env: dict[str, str], work: Path) -> tuple[float, float]:
    """(CPU s, wall s) from the command to its first streamed send."""
    marks = work / "marks"
    t = time.time()
    proc = subprocess.run(
        [python, "-c", HOOK, "cbbench", "run", "--endpoint", url, "--served-model", ab.MODEL,
         "--workload", "random", "--input-len", "16", "--output-len", "16", "--num-requests",
         "20", "--request-rate", "100", "--output", str(work / "r.json")],
        capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir(),
        env={**env, "CBBENCH_BENCH_MARKS": str(marks)},
    )
    if proc.returncode != 0 or not marks.read_text():
        raise SystemExit(f"cbbench run failed:\n{proc.stderr[-2000:]}")
    cpu, wall = (float(x) for x in marks.read_text().split())
    return cpu, wall - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--against", help="a commit to measure beside this tree")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
    from timing_server import fetch_log, timing_server

    sides = ab.start_sides(args.against)
    print(f"# {ab._uptime()}")
    with tempfile.TemporaryDirectory(prefix="cbbench-start-") as tmp, \
            timing_server(150.0, 20.0) as url:
        work = Path(tmp)
        starts = ab.start_envs(work, "cbbench not cached")
        for how, env in starts.items():
            got: dict[str, list[tuple[float, float]]] = {label: [] for label in sides}
            if how == "bytecode cached":
                for python in sides.values():  # fill the cache: not counted
                    _one(python, url, env, work)
            fetch_log(url, clear=True)
            for _ in range(args.runs):
                for label, python in sides.items():
                    got[label].append(_one(python, url, env, work))
                    fetch_log(url, clear=True)
            for label, runs in got.items():
                cpu = statistics.median(c for c, _ in runs)
                wall = statistics.median(w for _, w in runs)
                print(f"| {label} | {how} | {cpu:.2f} | {wall:.2f} | "
                      + ", ".join(f"{c:.2f}/{w:.2f}" for c, w in runs) + " |")
    print(f"# {ab._uptime()}")


if __name__ == "__main__":
    main()
