"""Host time async scheduling hides per decode step (issue 29 item 7). Not collected by pytest.

    python tests/bench/bench_async_scheduling.py --json OUT [--running 1,64,256] [--steps 300]

Two engines as tests/bench/bench_host_overhead.py builds them (the real scheduler, block manager,
model runner, sampler and postprocess; the model a no-op), one with async scheduling and one
without, stepped one after the other so both see the same machine. With async scheduling the
model runner predicts step n+1's inputs between step n's launch and its tokens' copy to the
host (engine/torch/async_prepare.py); on a GPU that runs while the device works, so it leaves the
host's critical path. On the CPU everything runs in order, so the time of that prediction is
measured (``predict_us``) and taken out:

- ``sync_us_per_step``: host µs per step without async (all of it between two forwards);
- ``async_critical_us_per_step``: with async, the step minus the prediction: what stays
  between two forwards;
- ``hidden_us_per_step`` = sync - async critical: host time moved under the device's;
- ``hit_rate``: steps whose inputs came from the prediction (a steady decode: all of them).

Medians of ``--steps`` timed steps after ``--warmup``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_host_overhead import build  # noqa: E402

from cbbench.engine.torch import async_prepare  # noqa: E402


class PredictTimer:
    """Wraps async_prepare.predict (as the model runner calls it) and sums its time."""

    def __init__(self) -> None:
        self.real = async_prepare.predict
        self.us = 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.real(*args, **kwargs)
        finally:
            self.us += (time.perf_counter() - t0) * 1e6


def measure(n: int, args) -> dict:
    sync_engine = build(n, args, async_scheduling=False)
    async_engine = build(n, args, async_scheduling=True)
    timer = PredictTimer()
    async_prepare.predict = timer
    try:
        sync_us, critical_us, predict_us = [], [], []
        runner = async_engine.executor
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            sync_engine.step()
            t1 = time.perf_counter()
            timer.us = 0.0
            async_engine.step()
            t2 = time.perf_counter()
            if i == args.warmup:
                hits0, misses0 = runner.async_hits, runner.async_misses
            if i >= args.warmup:
                sync_us.append((t1 - t0) * 1e6)
                critical_us.append((t2 - t1) * 1e6 - timer.us)
                predict_us.append(timer.us)
    finally:
        async_prepare.predict = timer.real
    hits, misses = runner.async_hits - hits0, runner.async_misses - misses0
    same = [r.output_token_ids for r in sync_engine.scheduler.running] == [
        r.output_token_ids for r in async_engine.scheduler.running
    ]
    sync, critical = statistics.median(sync_us), statistics.median(critical_us)
    return {
        "sync_us_per_step": round(sync, 1),
        "async_critical_us_per_step": round(critical, 1),
        "predict_us": round(statistics.median(predict_us), 1),
        "hidden_us_per_step": round(sync - critical, 1),
        "hidden_fraction": round((sync - critical) / sync, 3),
        "hit_rate": round(hits / max(1, hits + misses), 3),
        "same_tokens": same,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--running", default="1,64,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--vocab", type=int, default=512)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result: dict = {"by_running": {}}
    for n in (int(x) for x in args.running.split(",")):
        result["by_running"][str(n)] = m = measure(n, args)
        print(f"{n:4d} running: {m}", flush=True)
    argv_used = argv if argv is not None else sys.argv[1:]
    result["command"] = ("python tests/bench/bench_async_scheduling.py "
                         + " ".join(argv_used).replace(str(args.json), "OUT"))  # fmt: skip
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
