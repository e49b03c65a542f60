"""The main command with the torch backend (kernels/torch_native.py) of another checkout
against this one, side by side: fresh processes run alternately (old, new, then new, old, ...)
on the same machine under the same load; CPU seconds (user + sys) of each whole command.

    git worktree add /tmp/base REV
    python tests/bench/bench_torch_native_ab.py --against /tmp/base --num-requests 200 --reps 2

Only torch_native.py is swapped (loaded from the other checkout as
cbbench.kernels.torch_native before anything imports it); the rest is this checkout's, so
the ratio is that file's alone. Wall time is printed too but, on a shared machine, the CPU
seconds are what compare."""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import importlib.util, sys
which, old_file, args = sys.argv[1], sys.argv[2], sys.argv[3:]
import cbbench.kernels
if which == "old":
    name = "cbbench.kernels.torch_native"
    spec = importlib.util.spec_from_file_location(name, old_file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
import cbbench.kernels.torch_native as tn
assert (tn.__file__ == old_file) == (which == "old"), tn.__file__
sys.argv = ["cbbench"] + args
from cbbench.cli.app import main
main()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, type=Path, help="the other checkout's root")
    ap.add_argument("--num-requests", default="200")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    old_file = str((a.against / "kernels" / "torch_native.py").resolve())
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.reps):
            for which in ("old", "new") if i % 2 == 0 else ("new", "old"):
                r0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
                subprocess.run(
                    [sys.executable, "-c", CHILD, which, old_file, "run", "--workload",
                     "sharegpt", "--num-requests", a.num_requests, "--quiet",
                     "--output", str(Path(tmp) / f"{which}_{i}.json")],
                    check=True, stdout=subprocess.DEVNULL)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                used = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
                cpu[which].append(used)
                print(f"{which} rep {i}: {used:.1f} CPU-s, {time.time() - w0:.0f} s wall, "
                      f"1-min load {os.getloadavg()[0]:.1f}", flush=True)
    for which, v in cpu.items():
        print(f"{which}: {[round(x, 1) for x in v]} CPU-s, mean {sum(v) / len(v):.1f}")
    print(f"old / new (mean CPU-s): {sum(cpu['old']) / sum(cpu['new']):.3f}")


if __name__ == "__main__":
    main()
