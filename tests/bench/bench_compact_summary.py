"""The compact summary's cost (analysis/compact/compact_summary.py): time and memory of the full
summary of a million-request compact run, and its speed beside the object path's
runner._summary on a real run converted both ways.

    python tests/bench/bench_compact_summary.py --requests 1000000 --replicas 8 \\
        --steps 4000000 --real 10000 --out results/compact_summary.md

- synthetic: a CompactRun built directly with numpy (--requests over --replicas, --steps
  step end times in all, ShareGPT-like output lengths of mean ~200 tokens, every request's
  tokens a contiguous slice; an iteration table with every column the engine writes), then
  runner._summary with --slo and the default percentiles. Run in a child process: its
  wall time around the summary alone; its peak RSS for the whole process (rusage) and the
  summary's own peak (VmHWM reset through /proc/self/clear_refs after the build, then read).
- real: --real ShareGPT requests on the simulated H200 (llama-3-8b, Poisson 400 req/s, DP 8)
  with run_engine; then runner._summary of the object run and of the converted
  run, alternated --repeats times: the best time of each and their ratio, and whether the
  per-request figures agree (the tests check the whole dict).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SLO = "ttft=200,tpot=50"
ENGINE = dict(engine="sim", gpu="h200", model="llama-3-8b")


def _engine(dp: int):
    from cbbench.engine.args import EngineArgs

    return EngineArgs(data_parallel_size=dp, router="least-requests", **ENGINE)


def _spec(dp: int, n: int):
    from cbbench.bench.runner import RunSpec
    from cbbench.options import LoadOptions, OutputOptions

    return RunSpec(LoadOptions(workload="sharegpt", num_requests=n, request_rate="400"),
                   _engine(dp), OutputOptions(slo=SLO))


def _resolved(dp: int):
    """A real run's EngineInfo (the GPU spec the engine summary reads)."""
    from cbbench.bench.runner import plan_schedule
    from cbbench.targets.engine import run_engine

    spec = _spec(dp, 20)
    sched = plan_schedule(spec)
    return run_engine(spec.engine, sched.wreqs, sched.arrivals).resolved


def synthetic_run(n: int, replicas: int, steps: int, seed: int = 0):
    """A plausible compact run: per replica, steps of 8-20 ms; each request's tokens a
    contiguous slice starting at a random step, its arrival 5-200 ms before its first token;
    rows in arrival order, one rejected request in 10,000."""
    from cbbench.analysis.compact.compact_run import CompactRequests, CompactRun, StepTable

    rng = np.random.default_rng(seed)
    per = steps // replicas
    ends, cols = [], []
    for k in range(replicas):
        dur = rng.uniform(0.008, 0.020, per)
        end = np.cumsum(dur)
        ends.append(end)
        cols.append((end - dur, dur, np.full(per, k)))
    out = np.clip(rng.lognormal(5.0, 0.8, n).astype(np.int64), 1, 2000)  # mean ~200
    replica = rng.integers(0, replicas, n)
    first = (rng.random(n) * (per - out)).astype(np.int64)
    first_t = np.concatenate(ends)[replica * per + first]
    arrival = first_t - rng.uniform(0.005, 0.2, n)
    order = np.argsort(arrival, kind="stable")
    rejected = np.zeros(n, dtype=bool)
    rejected[rng.random(n) < 1e-4] = True
    out, replica, first, arrival = out[order], replica[order], first[order], arrival[order]
    first[rejected] = -1
    out[rejected] = 0
    req = CompactRequests(
        id=np.arange(n), prompt_tokens=rng.integers(4, 1024, n), output_tokens=out,
        max_tokens=np.where(rejected, 200, out), arrival_s=arrival,
        first_scheduled_s=np.where(rejected, np.nan, arrival + 0.001), replica=replica,
        first_step=first, priority=np.zeros(n, dtype=np.int64),
        errors={int(i): ("too long", "rejected") for i in np.flatnonzero(rejected)})
    start = np.concatenate([c[0] for c in cols])
    by_start = np.argsort(start, kind="stable")
    m = len(start)
    running = rng.integers(20, 80, m)
    zero = np.broadcast_to(np.int64(0), (m,))
    columns = {
        "index": np.arange(m), "start_s": start[by_start],
        "duration_s": np.concatenate([c[1] for c in cols])[by_start],
        "num_prefill_tokens": rng.integers(0, 2, m) * rng.integers(1, 1024, m),
        "num_decode_tokens": running, "token_budget": np.broadcast_to(np.int64(8192), (m,)),
        "num_prefill_reqs": rng.integers(0, 2, m), "num_decode_reqs": running,
        "num_running": running, "num_waiting": zero, "num_preempted": zero,
        "kv_blocks_used": rng.integers(100, 5000, m),
        "kv_blocks_total": np.broadcast_to(np.int64(20000), (m,)),
        "bytes_moved": rng.uniform(1.6e10, 1.7e10, m), "flops": rng.uniform(1e12, 2e12, m),
        "num_swapped_out_blocks": zero, "num_swapped_in_blocks": zero,
        "swap_time_s": np.broadcast_to(0.0, (m,)), "num_cached_tokens": zero,
        "num_prefix_queried_tokens": zero,
        "num_logits": running, "attn_key_pairs": rng.uniform(1e4, 1e5, m),
        "attn_keys_read": rng.uniform(1e4, 1e5, m), "attn_decode_keys": rng.uniform(1e4, 1e5, m),
        "num_drafts": zero, "draft_tokens": zero, "accepted_tokens": zero,
        "emitted_tokens": running, "num_sampled_reqs": running,
        "replica": np.concatenate([c[2] for c in cols])[by_start],
    }
    columns["predicted_s"] = columns["duration_s"]
    last_end = max(float(e[-1]) for e in ends)
    return CompactRun(req, ends, StepTable(columns), last_end, False, _resolved(replicas))


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_synthetic(args) -> dict:
    from cbbench.bench.runner import _summary

    t0 = time.perf_counter()
    run = synthetic_run(args.requests, args.replicas, args.steps)
    build_s = time.perf_counter() - t0
    spec = _spec(args.replicas, args.requests)
    base = _rss_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here: the summary's own peak
    t0 = time.perf_counter()
    summary = _summary(spec, None, run)
    summary_s = time.perf_counter() - t0
    figures = {
        "requests": len(run.requests), "steps": len(run.steps), "build_s": build_s,
        "summary_s": summary_s, "rss_before_summary_mb": base,
        "summary_peak_rss_mb": _rss_mb("VmHWM"),
        "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "itl_count": summary["itl_ms"]["count"], "completed": summary["completed"],
    }
    # Beside it: the request rows streamed (not kept), and the summary with --slice.
    from cbbench.analysis.compact.compact_rows import compact_request_dicts

    t0 = time.perf_counter()
    rows = sum(1 for _ in compact_request_dicts(run, False))
    figures |= {"request_rows": rows, "request_rows_s": time.perf_counter() - t0}
    sliced = spec.with_output(slice=f"{args.slice!r}s")
    t0 = time.perf_counter()
    figures |= {"slices": len(_summary(sliced, None, run)["slices"]),
                "summary_with_slices_s": time.perf_counter() - t0}
    return figures


def child_real(args) -> dict:
    from cbbench.analysis.compact.compact_convert import compact_from_engine_run
    from cbbench.bench.runner import _summary, plan_schedule
    from cbbench.targets import engine as target

    spec = _spec(8, args.real)
    sched = plan_schedule(spec)
    sets = []
    real = target.build_replicas
    target.build_replicas = lambda a: (lambda rs: (sets.append(rs[0]), rs)[1])(real(a))
    run = target.run_engine(spec.engine, sched.wreqs, sched.arrivals)
    t0 = time.perf_counter()
    compact = compact_from_engine_run(run, sets[0].assignments)
    convert_s = time.perf_counter() - t0
    obj, com = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ref = _summary(spec, sched, run)
        obj.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = _summary(spec, None, compact)
        com.append(time.perf_counter() - t0)
    pooled_pct = [k for k in ref["itl_ms"] if k not in ("mean", "std")]
    same = (all(got[k] == ref[k] for k in ("completed", "ttft_ms", "tpot_ms", "e2el_ms",
                                           "itl_histogram", "engine"))
            and got["steady_state"]["ttft_ms"] == ref["steady_state"]["ttft_ms"]
            and all(got["itl_ms"][k] == ref["itl_ms"][k] for k in pooled_pct))
    return {"requests": len(run.records), "iterations": len(run.iterations),
            "object_summary_s": min(obj), "compact_summary_s": min(com),
            "ratio": min(obj) / min(com), "convert_s": convert_s, "per_request_equal": same}


def child_array(args) -> dict:
    """--array N requests run by the array simulator (engine/sim/array_sim.py), then the
    compact summary of its own CompactRun: its time and its own peak, as for the synthetic."""
    from cbbench.bench.runner import _summary, plan_schedule
    from cbbench.targets.engine_compact import run_engine_compact

    spec = _spec(8, args.array)
    sched = plan_schedule(spec)
    t0 = time.perf_counter()
    run = run_engine_compact(spec.engine, sched.wreqs, sched.arrivals)
    sim_s = time.perf_counter() - t0
    assert run is not None, "the array simulator handed the run back"
    base = _rss_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    summary = _summary(spec, None, run)
    return {"requests": len(run.requests), "steps": len(run.steps), "array_sim_s": sim_s,
            "summary_s": time.perf_counter() - t0, "rss_before_summary_mb": base,
            "summary_peak_rss_mb": _rss_mb("VmHWM"),
            "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "itl_count": summary["itl_ms"]["count"]}


def _child(kind: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--requests", str(args.requests),
           "--replicas", str(args.replicas), "--steps", str(args.steps), "--real",
           str(args.real), "--repeats", str(args.repeats), "--slice", str(args.slice),
           "--array", str(args.array)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4_000_000)
    ap.add_argument("--real", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slice", type=float, default=60.0, help="--slice of the sliced summary")
    ap.add_argument("--array", type=int, default=0,
                    help="also: this many requests run by the array simulator, summarized")
    ap.add_argument("--child", choices=("synthetic", "real", "array"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.child:
        fn = {"synthetic": child_synthetic, "real": child_real, "array": child_array}[args.child]
        print(json.dumps(fn(args)))
        return
    load = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    synthetic = _child("synthetic", args)
    load.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    real = _child("real", args) if args.real else None
    load.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    array = _child("array", args) if args.array else None
    if array is not None:
        load.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    report = {"synthetic": synthetic, "real": real, "array": array, "uptime": load,
              "command": " ".join(["python", "tests/bench/bench_compact_summary.py",
                                   *sys.argv[1:]])}
    print(json.dumps(report, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
