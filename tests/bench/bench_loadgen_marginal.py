"""The client's CPU per request at the margin: one process against --workers N, by rate.

    python tests/bench/bench_loadgen_marginal.py [--points 1:500 1:1000 1:2000 2:1000 2:2000]
        [--seconds 4] [--rounds 2] [--out results/loadgen_marginal_cpu.md]

Each point WORKERS:RATE runs the client twice in this process against one tests/timing_server.py
(TTFT 150 ms, ITL 20 ms, 16 output tokens, Poisson arrivals): a few requests (FEW) and RATE x
SECONDS of them. The difference of the two calls' CPU (getrusage: this process, and the reaped
worker processes for --workers N) over the difference of their request counts is the CPU each
further request costs, without what a call pays once (the workers' spawn and imports, the
connection pool): the figure a schedule's rate is paid in. This process's CPU is read when its
last request ended (the progress callback), so the summary after the run is not in it; the
workers' is read once they are reaped (their teardown is in it). The parent's and the workers'
shares are kept apart. Each point's rounds alternate with the other
points'; the table gives the lower of the rounds (the least disturbed by the machine).
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the timing server
from timing_server import timing_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 16
TTFT_MS, ITL_MS = 150.0, 20.0
FEW = 20
WARMUP_SEED = 1_000_000  # prompts of its own: nothing in a measured call repeats them
MODEL = "timing-model"  # what tests/timing_server.py serves


def _cpu(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
    return (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)


def one_call(url: str, n: int, rate: float, workers: int, seed: int) -> tuple[float, float]:
    """(the parent's CPU, the workers' CPU) of one client call of n requests at rate."""
    from cbbench.distributed.plan import LoadPlan
    from cbbench.distributed.run import run_load
    from cbbench.load.workload import WorkloadRequest
    from cbbench.targets.http import EndpointOptions, run_http

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    arrivals -= arrivals[0]
    wreqs = [WorkloadRequest(i, 2, TOKENS, prompt=f"m{seed}-{i}") for i in range(n)]
    opts = EndpointOptions(url, served_model=MODEL)
    at_end: list[resource.struct_rusage] = []

    def progress(done: int, total: int) -> None:  # this process, when the last request ended
        if done == total and not at_end:
            at_end.append(resource.getrusage(resource.RUSAGE_SELF))

    s0, k0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    if workers > 1:
        run = run_load(opts, wreqs, arrivals, LoadPlan(workers), on_progress=progress)
    else:
        run = run_http(opts, wreqs, arrivals, on_progress=progress)
    k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not at_end:
        raise SystemExit("the run never reported its last request: no figure")
    s1 = at_end[0]  # the summary after the run is not the load it keeps up with
    failed = sum(r.error is not None for r in run.records)
    if failed:
        raise SystemExit(f"{failed} of {n} requests failed at {rate:g} req/s: no figure")
    return _cpu(s0, s1), _cpu(k0, k1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", nargs="*", default=["1:500", "1:1000", "1:2000", "2:1000",
                                                    "2:2000"])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "loadgen_marginal_cpu.md"))
    args = ap.parse_args()
    points = [(int(w), float(r)) for w, r in (p.split(":") for p in args.points)]
    load0 = os.getloadavg()
    with timing_server(TTFT_MS, ITL_MS) as url:
        best: dict[tuple[int, float], tuple[float, float]] = {}
        for workers in sorted({w for w, _ in points}):  # imports and first-call costs, unmeasured
            one_call(url, FEW, points[0][1], workers, seed=WARMUP_SEED)
        for k in range(args.rounds):
            for workers, rate in points:
                many = int(rate * args.seconds)
                p_few, w_few = one_call(url, FEW, rate, workers, seed=2 * k)
                p_many, w_many = one_call(url, many, rate, workers, seed=2 * k + 1)
                per = ((p_many - p_few) / (many - FEW), (w_many - w_few) / (many - FEW))
                old = best.get((workers, rate))
                if old is None or sum(per) < sum(old):
                    best[(workers, rate)] = per
                print(f"round {k}: {workers}:{rate:g} parent {per[0] * 1e6:.0f} us, workers "
                      f"{per[1] * 1e6:.0f} us a request", flush=True)
    load1 = os.getloadavg()
    rows = []
    for (workers, rate), (parent, kids) in best.items():
        total = parent + kids
        rows.append(f"| {workers} | {rate:g} | {rate / workers:g} | {parent * 1e6:.0f} | "
                    f"{kids * 1e6:.0f} | {total * 1e6:.0f} | {total * rate:.2f} |")
    text = "\n".join([
        "# The client's CPU per request at the margin, by rate and process count (issue 41)",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; load average before "
        f"{load0[0]:.2f}, after {load1[0]:.2f}.",
        "",
        "```",
        "python tests/bench/bench_loadgen_marginal.py " + " ".join(sys.argv[1:]),
        "```",
        "",
        f"Against tests/timing_server.py (TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms, {TOKENS} output "
        f"tokens, Poisson arrivals), {args.seconds:g} s of schedule a call; CPU per request = the "
        f"difference of a {FEW}-request call and a full one over the difference of their request "
        f"counts (getrusage; this process's up to its last request's end, not the summary after), the lower of {args.rounds} rounds. `cores at the rate` = that CPU x "
        "the rate: what the client needs to keep the schedule, besides the server's own.",
        "",
        "| workers | rate (req/s) | rate a process | parent (us) | workers (us) | total (us) "
        "| cores at the rate |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
