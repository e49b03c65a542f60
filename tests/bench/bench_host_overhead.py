"""Host overhead per decode step: everything the CPU does for one engine iteration outside the
device work (issue 13 item 4). Not collected by pytest.

    python tests/bench/bench_host_overhead.py --json OUT [--running 1,64,256] [--steps 300]

The real engine (scheduler, block manager, model runner, sampler, postprocess, iteration record
and its analytic cost) runs with the model's forward replaced by a no-op: it returns a hidden
state of width 1 and logits of shape ``[rows that sample, vocab]`` from a preallocated tensor, so
what is timed is the host's work: scheduling, building the packed inputs (token ids, positions,
block tables, slot mappings, ``cu_seqlens``), sampling bookkeeping, postprocessing. The greedy
argmax over the logits is device work on a GPU; on the CPU it runs inline, so ``--vocab`` is
kept small (512: ~tens of µs at 256 rows, counted against us).

For each running count N: N requests of ``--prompt-len`` tokens are prefilled, then ``--warmup``
decode steps run untimed and ``--steps`` are timed one by one (``time.perf_counter``); OUT gets
the medians, ``{"us_per_step": {"1": a, "64": b, "256": c}, ...}``, plus a per-stage breakdown
from a second pass with the stages wrapped in timers (the wrappers add ~1 µs each).

The same run times nano-vllm's host path doing the same work (tests/bench/nanovllm_host_harness.py:
its decode scheduling, ``prepare_decode``, sampler bookkeeping and ``postprocess`` with a no-op
model), one step of each engine in turn so both see the same machine: ``nanovllm_us_per_step``
and ``ratio_to_nanovllm`` (cbbench / nano-vllm; the goal is <= 1.0 at 256 running), keyed by
the running count like ``us_per_step``. The host-overhead figure moves 2-3x between machines;
the ratio is what compares.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from cbbench.engine.core.clock import WallClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.request import Request, SamplingParams
from cbbench.engine.core.scheduler import SchedulerConfig
from cbbench.engine.model_config import MODEL_PRESETS
from cbbench.engine.sim.cost_model import CostModel
from cbbench.engine.torch.model_runner import ModelRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the nano-vllm harness beside it
from nanovllm_host_harness import BLOCK_HASH, NanoDecodeHarness  # noqa: E402

GOAL_US = {"1": 150.0, "256": 500.0}  # issue 13's goals
BLOCK_SIZE = 16
TOKEN_BUDGET = 2048


class NoOpModel(torch.nn.Module):
    """Stands in for the model: no device work, outputs of the shapes the runner reads."""

    def __init__(self, max_tokens: int, vocab: int) -> None:
        super().__init__()
        self.hidden = torch.zeros(max_tokens, 1)
        gen = torch.Generator().manual_seed(0)
        self.logits = torch.randn(max_tokens, vocab, generator=gen)
        self.attn_backend = None

    def forward(self, input_ids, positions, kv_caches, metadata):
        return self.hidden[: input_ids.shape[0]]

    def compute_logits(self, hidden):
        return self.logits[: hidden.shape[0]]


def build(num_running: int, args, async_scheduling: bool = False):
    config = dataclasses.replace(MODEL_PRESETS[args.model], vocab_size=args.vocab)
    # Room for every step the benchmark runs (warm-up, timed, breakdown): nobody finishes.
    max_tokens = args.warmup + 2 * args.steps + 8
    blocks = num_running * -(-(args.prompt_len + max_tokens) // BLOCK_SIZE) + 1
    model = NoOpModel(max(TOKEN_BUDGET, num_running), args.vocab)
    runner = ModelRunner(
        model, config, [], BLOCK_SIZE, "cpu", torch.float32, max_num_seqs=num_running,
        async_scheduling=async_scheduling,
    )
    sched = SchedulerConfig(
        max_model_len=config.max_model_len,
        max_num_seqs=num_running,
        max_num_batched_tokens=TOKEN_BUDGET,
    )
    engine = Engine(
        EngineConfig(sched, blocks, BLOCK_SIZE), runner, WallClock(), CostModel(config, "bf16")
    )
    rng = np.random.default_rng(num_running)
    sampling = SamplingParams(ignore_eos=True)
    for i in range(num_running):
        ids = rng.integers(0, args.vocab, args.prompt_len).tolist()
        engine.add_request(
            Request(i, args.prompt_len, max_tokens, prompt_token_ids=ids, sampling=sampling)
        )
    # Prefill everyone: then every step is N decode rows.
    sched = engine.scheduler
    while sched.waiting or any(r.num_output_tokens == 0 for r in sched.running):
        engine.step()
    return engine


def time_steps(engine: Engine, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step = engine.step()
        out.append((time.perf_counter() - t0) * 1e6)
        assert step is not None and step.record.num_prefill_tokens == 0
    return out


def time_side_by_side(engine: Engine, nano: NanoDecodeHarness, steps: int):
    """One cbbench step, then one nano-vllm step, ``steps`` times: µs of each."""
    ours, theirs = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        step = engine.step()
        t1 = time.perf_counter()
        finished = nano.step()
        t2 = time.perf_counter()
        assert step is not None and step.record.num_prefill_tokens == 0 and not finished
        ours.append((t1 - t0) * 1e6)
        theirs.append((t2 - t1) * 1e6)
    return ours, theirs


def time_steps_of(fn, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def breakdown(engine: Engine, steps: int) -> dict:
    """Median µs of schedule, execute (prepare + no-op forward + sample) and the rest."""
    times: dict[str, list[float]] = {"schedule": [], "execute": []}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times[name].append((time.perf_counter() - t0) * 1e6)

        return wrapper

    engine.scheduler.schedule = timed("schedule", engine.scheduler.schedule)
    engine.executor.execute = timed("execute", engine.executor.execute)
    total = time_steps(engine, steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    med["postprocess_and_record"] = statistics.median(
        t - s - e for t, s, e in zip(total, times["schedule"], times["execute"], strict=True)
    )
    return med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="output file")
    ap.add_argument("--running", default="1,64,256", help="running-request counts")
    ap.add_argument("--steps", type=int, default=300, help="timed decode steps (>= 200)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--model", default="llama-3-8b", help="preset: block-table width, hidden")
    ap.add_argument("--vocab", type=int, default=512)
    args = ap.parse_args(argv)
    command = "python tests/bench/bench_host_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    torch.set_num_threads(1)  # a GPU host's CPU side is one Python thread
    result: dict = {"us_per_step": {}, "nanovllm_us_per_step": {}, "ratio_to_nanovllm": {},
                    "p90_us_per_step": {}, "breakdown_us": {}}  # fmt: skip
    for n in (int(x) for x in args.running.split(",")):
        engine = build(n, args)
        max_tokens = args.warmup + 2 * args.steps + 8
        nano = NanoDecodeHarness(n, args.prompt_len, max_tokens, args.vocab, BLOCK_SIZE, seed=n)
        time_side_by_side(engine, nano, args.warmup)
        us, nano_us = time_side_by_side(engine, nano, args.steps)
        ours, theirs = statistics.median(us), statistics.median(nano_us)
        result["us_per_step"][str(n)] = round(ours, 1)
        result["nanovllm_us_per_step"][str(n)] = round(theirs, 1)
        result["ratio_to_nanovllm"][str(n)] = round(ours / theirs, 3)
        result["p90_us_per_step"][str(n)] = round(float(np.percentile(us, 90)), 1)
        parts = breakdown(engine, args.steps)
        # The greedy argmax runs inside execute; on a GPU it is device work.
        logits = engine.executor.model.logits[:n]
        parts["of_which_argmax_stand_in"] = statistics.median(
            time_steps_of(functools.partial(logits.argmax, -1), args.steps)
        )
        result["breakdown_us"][str(n)] = {k: round(v, 1) for k, v in parts.items()}
        print(f"{n:4d} running: {result['us_per_step'][str(n)]:8.1f} µs/step (median), nano-vllm "
              f"{theirs:8.1f}, ratio {ours / theirs:.2f}, breakdown "
              f"{result['breakdown_us'][str(n)]}", flush=True)  # fmt: skip
    result["goal_us"] = GOAL_US
    result["goal_ratio_to_nanovllm"] = {"256": 1.0}
    result["nanovllm_harness"] = {
        "source": "GeeeekExplorer/nano-vllm (read, rewritten: tests/bench/nanovllm_host_harness.py)",
        "block_hash": BLOCK_HASH,
        "timed": "schedule (decode branch) + prepare_decode + prepare_sample + no-op model + "
                 "greedy argmax + tolist + postprocess (hash_blocks, append, finish check)",
    }
    result["config"] = {
        "model_shape": args.model,
        "vocab": args.vocab,
        "prompt_len": args.prompt_len,
        "block_size": BLOCK_SIZE,
        "steps": args.steps,
        "warmup": args.warmup,
        "torch_threads": 1,
    }
    result["command"] = command.replace(str(args.json), "OUT")
    result["machine"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
