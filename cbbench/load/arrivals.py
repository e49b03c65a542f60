"""Open-loop arrival schedules, computed up front from the seed.

``gamma`` with shape = burstiness and mean interval 1/rate (burstiness 1 is Poisson; below 1
is burstier, above 1 more regular), as vLLM's benchmark draws them; ``constant`` spaces requests
exactly 1/rate apart; ``trace`` uses the workload's own ``arrival_s``. Rate ``inf`` sends
everything at t = 0. The first request arrives at t = 0.
"""

from __future__ import annotations

import math

import numpy as np

from cbbench.errors import UsageError
from cbbench.load.workload import WorkloadRequest

ARRIVAL_PROCESSES = ("auto", "gamma", "constant", "trace")
# A schedule longer than this is a mistake (a rate of 1e-9 req/s, an arrival_s of 1e300), not
# a benchmark: refuse it rather than sleep for years or overflow the clock.
MAX_SCHEDULE_S = 30 * 24 * 3600.0


def parse_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise UsageError(f"invalid request rate {text!r}: a positive number or 'inf'") from None
    if not rate > 0 or math.isnan(rate):
        raise UsageError(f"invalid request rate {text!r}: must be > 0 (or 'inf')")
    return rate


def resolve_process(process: str, rate: float, has_trace: bool, rate_given: bool) -> str:
    if process not in ARRIVAL_PROCESSES:
        raise UsageError(f"unknown arrival process {process!r}: use {', '.join(ARRIVAL_PROCESSES)}")
    if process == "auto":
        return "trace" if has_trace and not rate_given else "gamma"
    if process == "trace" and not has_trace:
        raise UsageError("--arrival trace needs a workload whose requests all carry 'arrival_s'")
    return process


def arrival_times(
    requests: list[WorkloadRequest], rate: float, burstiness: float, process: str, seed: int
) -> np.ndarray:
    times = _arrival_times(requests, rate, burstiness, process, seed)
    if times.size and not times.max() <= MAX_SCHEDULE_S:
        raise UsageError(
            f"the arrival schedule spans {times.max():.3g} s, more than {MAX_SCHEDULE_S:.0f} s "
            "(30 days): check the request rate or the trace's arrival_s"
        )
    return times


def _arrival_times(
    requests: list[WorkloadRequest], rate: float, burstiness: float, process: str, seed: int
) -> np.ndarray:
    n = len(requests)
    if process == "trace":
        t = np.array([r.arrival_s for r in requests], dtype=np.float64)
        return t - t.min()
    if math.isinf(rate):
        return np.zeros(n)
    if process == "constant":
        return np.arange(n) / rate
    if not burstiness > 0:
        raise UsageError(f"--burstiness must be > 0, got {burstiness}")
    # A separate stream from request sampling, so changing the rate keeps the same requests.
    rng = np.random.default_rng([seed, 1])
    intervals = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.concatenate(([0.0], np.cumsum(intervals[:-1])))
