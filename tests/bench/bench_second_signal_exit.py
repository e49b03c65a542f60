"""Seconds from the second SIGINT to the exit of `cbbench sweep` on the torch CPU engine, for two
source trees run alternately (each imported through PYTHONPATH).

    git worktree add /tmp/ref REV
    python tests/bench/bench_second_signal_exit.py /tmp/ref . --pairs 5

The first SIGINT comes 1.5 s into the first rate, the second 0.5 s after the run says it is
stopping (as tests/cli/test_hostile_interrupts.py sends them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIRST_AFTER_S = 1.5
SECOND_AFTER_S = 0.5
LONG_OUTPUT_LEN = 1500  # requests still in flight when the second signal comes


def _wait_for(proc: subprocess.Popen, text: str) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        if text in line:
            return
    raise RuntimeError(f"the run ended before saying {text!r}")


def one_exit(tree: str, workload: Path, out_dir: Path) -> tuple[int, float]:
    """The exit status and the seconds from the second signal to the exit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cbbench.cli.app import main; main()", "sweep",
         "--engine", "torch", "--device", "cpu", "--model", "tiny", "--num-requests", "30",
         "--min-duration", "0", "--workload", str(workload), "--rates", "4,8",
         "--out-dir", str(out_dir)],
        cwd=out_dir.parent,  # not a tree's root: `python -c` imports the current folder first
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(Path(tree).resolve())))
    try:
        _wait_for(proc, "rate 4 (1/2)")
        time.sleep(FIRST_AFTER_S)
        proc.send_signal(signal.SIGINT)
        _wait_for(proc, "stopping")
        time.sleep(SECOND_AFTER_S)
        proc.send_signal(signal.SIGINT)
        t = time.monotonic()
        proc.wait()  # no timeout: Popen.wait(timeout) polls in steps of up to 50 ms
        return proc.returncode, time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref")
    ap.add_argument("new")
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    workload = root / "w.jsonl"
    workload.write_text("".join(
        json.dumps({"prompt_len": 8, "output_len": LONG_OUTPUT_LEN}) + "\n" for _ in range(30)))
    secs: dict[str, list[float]] = {a.ref: [], a.new: []}
    for i in range(a.pairs):
        for tree in ([a.ref, a.new] if i % 2 == 0 else [a.new, a.ref]):
            rc, s = one_exit(tree, workload, root / f"{i}-{len(secs[tree])}-{tree == a.new}")
            secs[tree].append(s)
            print(f"{tree}: exit {rc} after {s:.3f} s", flush=True)
    for tree, xs in secs.items():
        print(f"{tree}: median {statistics.median(xs):.3f} s of {[round(x, 3) for x in xs]}")


if __name__ == "__main__":
    main()
