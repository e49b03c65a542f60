"""The summary's CPU time on one tree, to set beside another's (issue 36 item 2: one summary
pipeline on columns). Run it once per tree, the old one first extracted with git archive:

    git archive d05387a cbbench tests/bench | tar -x -C /tmp/old
    python tests/bench/bench_summary_columns.py /tmp/old
    python tests/bench/bench_summary_columns.py .

- object: runner._summary of a simulated run of --object requests (run_engine, DP 2);
- compact: runner._summary of bench_compact_summary's synthetic CompactRun of --compact;
- records: summarize, time_slices, steady_state and by_turn of --records synthetic HTTP-like
  records (events of several tokens, failures, cancels, slot waits, priorities, turns),
  given the records (each call converts them, on a tree with columns) and, where the tree
  has summary/columns.py, converted once first (as the runner does).
CPU time (time.process_time), best of --repeats: the host is shared.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path


def records(n: int, seed: int = 1):
    from cbbench.analysis.records import RequestRecord

    rng = random.Random(seed)
    out = []
    for i in range(n):
        start = rng.uniform(0, 20)
        slot = start + rng.uniform(0, 0.5) if rng.random() < 0.3 else None
        send = (slot or start) + rng.uniform(0, 0.01) if rng.random() > 0.05 else None
        k = rng.choice([0, 1, 1, 2, 5, 17, 40]) if send is not None else 0
        t = (send or start) + rng.uniform(0.01, 1)
        times = []
        for _ in range(k):
            times.append(t)
            if rng.random() > 0.2:
                t += rng.expovariate(30)
        ev = None
        if k and rng.random() < 0.3:
            times = sorted(set(times))
            ev = [rng.randint(0, 3) for _ in times]
        u = rng.random()
        err, et = ("boom", rng.choice(["timeout", None])) if u < 0.08 else (None, None)
        out.append(RequestRecord(
            id=i, prompt_tokens=rng.randint(1, 900), output_tokens=sum(ev) if ev else len(times),
            intended_start_s=start, send_s=send, token_times_s=times, error=err, error_type=et,
            cancelled=0.08 <= u < 0.12, priority=rng.choice([0, 0, 1, 3]), slot_s=slot,
            event_tokens=ev, max_tokens=rng.choice([None, 40, 17]),
            finish_reason=rng.choice(["stop", "length", None]),
            reasoning_tokens=rng.choice([None, 0, 3]), turn=rng.choice([None, 1, 2, 3])))
    return out


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path, help="the tree whose cbbench is timed")
    ap.add_argument("--object", type=int, default=3000)
    ap.add_argument("--compact", type=int, default=100_000)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    root = args.root.resolve()
    sys.path[:0] = [str(root), str(root / "tests" / "bench")]
    import bench_compact_summary as bcs

    import cbbench
    from cbbench.analysis.summary.metrics import summarize
    from cbbench.analysis.summary.slices import time_slices
    from cbbench.analysis.summary.steady_state import steady_state
    from cbbench.analysis.summary.turns import by_turn
    from cbbench.bench.runner import _summary, plan_schedule
    from cbbench.targets.engine import run_engine

    assert Path(cbbench.__file__).resolve().is_relative_to(root), cbbench.__file__
    out: dict = {"root": str(args.root), "command": " ".join(["python", *sys.argv])}
    spec = bcs._spec(2, args.object)
    sched = plan_schedule(spec)
    run = run_engine(spec.engine, sched.wreqs, sched.arrivals)
    out["object_summary_cpu_s"] = best(lambda: _summary(spec, sched, run), args.repeats)
    compact = bcs.synthetic_run(args.compact, 8, 4 * args.compact)
    cspec = bcs._spec(8, args.compact)
    out["compact_summary_cpu_s"] = best(lambda: _summary(cspec, None, compact), args.repeats)
    recs = records(args.records)

    def every(run) -> None:
        summarize(run, 22.0, {"ttft": 500.0}, (50, 90, 99))
        time_slices(run, 22.0, 2.0)
        steady_state(run, 22.0)
        by_turn(run)

    out["records_each_call_cpu_s"] = best(lambda: every(recs), args.repeats)
    try:
        from cbbench.analysis.summary.columns import request_columns
    except ImportError:  # a tree before the columns
        pass
    else:
        out["records_converted_once_cpu_s"] = best(lambda: every(request_columns(recs)),
                                                   args.repeats)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
