"""What the live view costs the load generator: the same open-loop schedule with and without
the view (its LiveBoard fed by the run, rich's Live redrawing the panel twice a second into an
in-memory terminal), interleaved ABAB... against the bench server of bench_loadgen.py (its own
process). Reports per side the client's CPU per request (this process: the view's thread
included) and the send lag p50/p99, and the ratios view/no-view.

    python tests/bench/bench_live_view.py [--rate 300] [--duration 5] [--pairs 3]

Not collected by pytest. Results: results/live_view_cost.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource

import bench_loadgen  # tests/bench/, beside this file
import numpy as np


def one(port: int, rate: float, duration: float, seed: int, view: bool) -> dict:
    from rich.console import Console

    from cbbench.cli.live import LiveView
    from cbbench.distributed.plan import LoadPlan
    from cbbench.distributed.run import run_load
    from cbbench.load.arrivals import arrival_times
    from cbbench.load.workload import WorkloadRequest
    from cbbench.targets.http import EndpointOptions

    n = int(rate * duration)
    wreqs = [WorkloadRequest(i, 2, bench_loadgen.TOKENS_PER_REQUEST, prompt="hello there")
             for i in range(n)]
    arrivals = arrival_times(wreqs, rate, 1.0, "gamma", seed)
    opts = EndpointOptions(f"http://127.0.0.1:{port}", served_model=bench_loadgen.MODEL)
    screen = io.StringIO()
    lv = LiveView(True, console=Console(file=screen, force_terminal=True, width=100)) \
        if view else None
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    if lv is not None:
        with lv as board:
            board.plan(n, float(arrivals[-1]), rate)
            run = run_load(opts, wreqs, arrivals, LoadPlan(1), on_progress=board.on_progress,
                           live=board)
    else:
        run = run_load(opts, wreqs, arrivals, LoadPlan(1))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    lag = np.array([(r.send_s - r.intended_start_s) * 1e3 for r in run.records])
    return {"view": view, "requests": n, "completed": sum(r.ok for r in run.records),
            "cpu_us_per_request": cpu / n * 1e6,
            "send_lag_p50_ms": float(np.percentile(lag, 50)),
            "send_lag_p99_ms": float(np.percentile(lag, 99)),
            "panel_frames": screen.getvalue().count("cbbench run")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--pairs", type=int, default=3)
    a = ap.parse_args()
    proc, port = bench_loadgen._start_server()
    runs = []
    try:
        for k in range(a.pairs):
            for view in ((False, True) if k % 2 == 0 else (True, False)):
                runs.append(one(port, a.rate, a.duration, k, view))
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    def med(view: bool, key: str) -> float:
        return float(np.median([r[key] for r in runs if r["view"] == view]))

    out = {
        "rate": a.rate, "duration_s": a.duration, "pairs": a.pairs,
        "loadavg_1min": os.getloadavg()[0],
        "cpu_us_per_request": {"off": med(False, "cpu_us_per_request"),
                               "on": med(True, "cpu_us_per_request")},
        "send_lag_p50_ms": {"off": med(False, "send_lag_p50_ms"),
                            "on": med(True, "send_lag_p50_ms")},
        "send_lag_p99_ms": {"off": med(False, "send_lag_p99_ms"),
                            "on": med(True, "send_lag_p99_ms")},
        "runs": runs,
    }
    out["cpu_ratio_on_off"] = out["cpu_us_per_request"]["on"] / out["cpu_us_per_request"]["off"]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
