"""Benchmark (not a test): the scheduler's own CPU cost per iteration at N running decodes.

Usage: python tests/bench/bench_scheduler.py [--running 256 1024] [--iters 2000] [--out results/]

Set-up: N requests with ShareGPT prompt lengths (seed 0) are admitted and prefilled, with
output lengths long enough that none finishes during the measurement; then each measured
iteration is a pure-decode step: Scheduler.schedule() (which also allocates a KV block whenever
a request crosses a block boundary) and the engine's postprocess (advance num_computed_tokens,
append the token and its timestamp, check the stop condition). No executor work is timed. The
sum of the two is what the README's side-by-side comparison with nano-vllm and vLLM measures;
figures from this script move with the machine's load, so compare them as ratios within one
session (e.g. against a detached worktree of another commit, alternating runs).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from cbbench.engine.core.clock import VirtualClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.request import Request
from cbbench.engine.core.scheduler import SchedulerConfig
from cbbench.engine.core.scheduler_output import ExecutorOutput
from cbbench.load.workload import load_workload

BLOCK_SIZE = 16
MAX_MODEL_LEN = 1 << 20


class NullExecutor:
    def execute(self, sched):
        return ExecutorOutput(sampled_token_ids=None, duration_s=1e-3)


def measure(num_running: int, iters: int, seed: int = 0) -> dict:
    lengths = [r.prompt_len for r in load_workload("sharegpt").requests]
    rng = np.random.default_rng(seed)
    prompts = rng.choice(lengths, num_running)
    max_out = 4 * iters + 1000  # nothing finishes during warm-up or measurement
    blocks = int(sum(-(-(p + max_out) // BLOCK_SIZE) for p in prompts)) + 1
    sched_cfg = SchedulerConfig(
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=num_running,
        max_num_batched_tokens=max(2048, num_running),
    )
    engine = Engine(EngineConfig(sched_cfg, blocks, BLOCK_SIZE), NullExecutor(), VirtualClock())
    for i, p in enumerate(prompts):
        engine.add_request(Request(i, int(p), max_out))
    while len(engine.scheduler.running) < num_running or engine.scheduler.waiting:
        engine.step()
    # Finish any prefill still in flight so every measured step is pure decode.
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()

    sched_ns, post_ns = [], []
    scheduler = engine.scheduler
    clock = engine.clock
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        out = scheduler.schedule(clock.now())
        t1 = time.perf_counter_ns()
        clock.advance_to(clock.now() + 1e-3)
        t2 = time.perf_counter_ns()
        engine._postprocess(out, ExecutorOutput(None), clock.now())
        t3 = time.perf_counter_ns()
        assert out.num_decode_reqs == num_running, (out.num_decode_reqs, len(out.scheduled_reqs), len(out.preempted))
        sched_ns.append(t1 - t0)
        post_ns.append(t3 - t2)
    s_us = statistics.median(sched_ns) / 1e3
    p_us = statistics.median(post_ns) / 1e3
    return {
        "running": num_running,
        "iterations": iters,
        "schedule_us_median": round(s_us, 1),
        "postprocess_us_median": round(p_us, 1),
        "total_us_median": round(s_us + p_us, 1),
        "schedule_us_per_request": round(s_us / num_running, 3),
        "total_us_per_request": round((s_us + p_us) / num_running, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None, help="folder for scheduler_cpu_cost.json")
    args = ap.parse_args()
    rows = [measure(n, args.iters) for n in args.running]
    report = {
        "command": "python tests/bench/bench_scheduler.py " + " ".join(
            ["--running", *map(str, args.running), "--iters", str(args.iters)]
        ),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "rows": rows,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scheduler_cpu_cost.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
