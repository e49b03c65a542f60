"""What the live view costs the load generator: the same open-loop schedule with and without
the view (its LiveBoard fed by the run, rich's Live redrawing the panel twice a second into an
in-memory terminal), interleaved ABAB... against the bench server of bench_loadgen.py (its own
process). Reports per side the client's CPU per request (this process: the view's thread
included) and the send lag p50/p99, and the ratios view/no-view.

    python tests/bench/bench_live_view.py [--rate 300] [--duration 5] [--pairs 3]
    python tests/bench/bench_live_view.py --frame-cost [--per-frame 150] [--frames 200]

--frame-cost: the CPU one redraw takes (time.thread_time around the board's snapshot and the
panel's render, into an in-memory terminal) while PER_FRAME new finished requests arrive
between frames (300 req/s at 2 frames/s), so the view's cost per second of a run is twice it.

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
            assert board is not None
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


def frame_cost(per_frame: int, frames: int) -> dict:
    import time

    from rich.console import Console

    from cbbench.analysis.records import RequestRecord
    from cbbench.cli.live import LiveView

    class Runner:
        t0 = time.perf_counter()
        in_flight = 40

    lv = LiveView(True, console=Console(file=io.StringIO(), force_terminal=True, width=100))
    board = lv.board
    board.plan(per_frame * frames, 60.0, 300.0)
    board.attach_http(Runner())
    costs = []
    k = 0
    for _ in range(frames):
        for _ in range(per_frame):
            t = k * 0.003
            board.on_record(k, RequestRecord(k, 100, 4, t, t + 0.0005,
                                             [t + 0.05, t + 0.06, t + 0.07, t + 0.08]), "usage")
            k += 1
        c0 = time.thread_time()
        lv.console.print(lv._panel())
        costs.append(time.thread_time() - c0)
    a = np.array(costs) * 1e3
    return {"per_frame_requests": per_frame, "frames": frames, "requests_seen": k,
            "frame_cpu_ms": {"p50": float(np.percentile(a, 50)),
                             "p99": float(np.percentile(a, 99)),
                             "last": float(a[-1])},
            "cpu_ms_per_second_at_2_frames": 2 * float(np.percentile(a, 50)),
            "loadavg_1min": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--frame-cost", action="store_true")
    ap.add_argument("--per-frame", type=int, default=150)
    ap.add_argument("--frames", type=int, default=200)
    a = ap.parse_args()
    if a.frame_cost:
        print(json.dumps(frame_cost(a.per_frame, a.frames), indent=1))
        return
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
