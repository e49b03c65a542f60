"""The calibration fit with OpenBLAS's default threads against one thread, side by side in one
process (engine/sim/roofline_select.fit_rates limits BLAS to one thread; this undoes the limit
for the "default" side). The input is test_calibrate's large-residual case: a simulated
ShareGPT run's shapes re-timed with known rates, half its decode steps stretched 4x.

    python tests/bench/bench_calibrate_threads.py [--reps 1]

Prints CPU and wall seconds per side and whether the two profiles are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "analysis")]  # helpers, test_calibrate

import test_calibrate as T  # noqa: E402
from helpers import run_spec  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from cbbench.analysis import calibration  # noqa: E402
from cbbench.engine.sim import roofline_select  # noqa: E402


def _case() -> dict:
    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    spec = run_spec(workload="sharegpt", num_requests=60, request_rate="30",
                    engine=EngineArgs(engine="sim", model="small", dtype="fp32",
                                      max_num_seqs=48, max_num_batched_tokens=1024))
    real = T.as_real(execute_run(spec), T.TRUE, seed=3)
    decodes = [it for it in real["iterations"] if it["num_prefill_tokens"] == 0]
    for it in decodes[::2]:
        it["duration_s"] *= 4.0
    return real


def _timed(real: dict, threads: int | None) -> tuple[float, float, str]:
    limited = calibration.fit_rates
    if threads is not None:  # the default side: the fit without the library's limit
        calibration.fit_rates = roofline_select._fit_rates
    try:
        c, w = time.process_time(), time.perf_counter()
        if threads is not None:
            with threadpool_limits(limits=threads, user_api="blas"):
                profile = T.calibrate([("real.json", real)])
        else:
            profile = T.calibrate([("real.json", real)])
        return time.process_time() - c, time.perf_counter() - w, json.dumps(profile, sort_keys=True)
    finally:
        calibration.fit_rates = limited


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    import scipy.optimize  # noqa: F401  (loaded first, so the limit reaches scipy's OpenBLAS)

    real = _case()
    cores = os.cpu_count() or 1
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {cores} CPUs")
    for rep in range(args.reps):
        d_cpu, d_wall, d_prof = _timed(real, cores)
        o_cpu, o_wall, o_prof = _timed(real, None)
        print(f"rep {rep}: default ({cores} BLAS threads) {d_cpu:.1f} CPU-s {d_wall:.1f} s wall; "
              f"library (1 thread) {o_cpu:.1f} CPU-s {o_wall:.1f} s wall; "
              f"CPU ratio {d_cpu / o_cpu:.2f}; profiles identical: {d_prof == o_prof}")
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
