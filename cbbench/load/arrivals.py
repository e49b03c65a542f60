"""Open-loop arrival schedules, computed up front from the seed.

``gamma`` with shape = burstiness and mean interval 1/rate (burstiness 1 is Poisson; below 1
is burstier, above 1 more regular), as vLLM's benchmark draws them; ``constant`` spaces requests
exactly 1/rate apart; ``trace`` uses the workload's own ``arrival_s``. Rate ``inf`` sends
everything at t = 0. The first request arrives at t = 0.

A ``Ramp`` (``--ramp START:END:SECONDS``) makes the rate a function of time, r(t) rising (or
falling) linearly from START to END over SECONDS and holding END after. Arrival times come from
the time-rescaling theorem: draw the same process at rate 1 (unit gaps, or gamma gaps of mean 1),
u_0 = 0 < u_1 < ..., and map each through the inverse of the integrated rate,
t_k = L^-1(u_k) with L(t) = integral of r from 0 to t; exact, no thinning or time steps.

``--duration`` keeps every arrival before the time is up (``count_within``), on the schedule as
it is sent: a trace's times as ``--time-scale`` makes them (``scale_times``); the schedule's
draws are prefix-consistent (the first n arrivals do not depend on how many more are drawn), so
a duration-bound schedule equals the count-bound one with the same number of requests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cbbench.errors import UsageError
from cbbench.load.limits import check_request_count
from cbbench.load.workload_types import WorkloadRequest

ARRIVAL_PROCESSES = ("auto", "gamma", "constant", "trace")
# A schedule longer than this is a mistake (a rate of 1e-9 req/s, an arrival_s of 1e300), not
# a benchmark: refuse it rather than sleep for years or overflow the clock.
MAX_SCHEDULE_S = 30 * 24 * 3600.0
ARRIVAL_RNG_STREAM = 1  # a separate random stream from request sampling (stream 0) and prompts
# When drawing arrivals until a duration is up: the first guess over the expected count, and the
# slack for the draw's spread, before doubling.
DURATION_GUESS_SLACK = 1.1
DURATION_GUESS_EXTRA = 16
DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ms|s|m|h)?\s*$")


@dataclass(frozen=True)
class Ramp:
    """A linear request-rate ramp: START req/s at t = 0 to END req/s at t = SECONDS, END after."""

    start_rate: float
    end_rate: float
    seconds: float

    @property
    def _accel(self) -> float:  # half the rate's slope: L(t) = start * t + accel * t^2
        return (self.end_rate - self.start_rate) / (2.0 * self.seconds)

    @property
    def ramp_requests(self) -> float:
        """Expected arrivals during the ramp itself: L(SECONDS)."""
        return self.seconds * (self.start_rate + self.end_rate) / 2.0

    def expected(self, t) -> np.ndarray:
        """L(t): the expected number of arrivals in [0, t]."""
        t = np.asarray(t, dtype=np.float64)
        tr = np.minimum(t, self.seconds)
        return (
            self.start_rate * tr
            + self._accel * tr * tr
            + self.end_rate * np.maximum(t - self.seconds, 0.0)
        )

    def time_of(self, u) -> np.ndarray:
        """L^-1(u): when the expected count reaches u (inf when the rate falls to 0 first)."""
        u = np.asarray(u, dtype=np.float64)
        b, a, total = self.start_rate, self._accel, self.ramp_requests
        inside = np.minimum(u, total)
        # a t^2 + b t - u = 0, in the form without cancellation for either sign of a (and a = 0);
        # the discriminant is >= END^2 >= 0 inside the ramp (clamped against rounding).
        root = b + np.sqrt(np.maximum(b * b + 4.0 * a * inside, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            t_in = np.where(inside > 0, 2.0 * inside / root, 0.0)
            after = (
                self.seconds + (u - total) / self.end_rate
                if self.end_rate > 0
                else np.full_like(u, math.inf)
            )
        return np.where(u <= total, t_in, after)

    def to_config(self) -> dict:
        return {"start_rate": self.start_rate, "end_rate": self.end_rate, "seconds": self.seconds}


def parse_ramp(text: str) -> Ramp:
    """'START:END:SECONDS' (rates in req/s, >= 0, not both 0; SECONDS > 0)."""
    parts = text.split(":")
    try:
        start, end, seconds = (float(p) for p in parts)
    except ValueError:
        raise UsageError(
            f"invalid --ramp {text!r}: use START:END:SECONDS, e.g. 10:200:60 (req/s, req/s, s)"
        ) from None
    if not all(math.isfinite(v) for v in (start, end, seconds)):
        raise UsageError(f"invalid --ramp {text!r}: rates and seconds must be finite numbers")
    if start < 0 or end < 0 or start == end == 0:
        raise UsageError(f"invalid --ramp {text!r}: rates must be >= 0 and not both 0")
    if not seconds > 0 or seconds > MAX_SCHEDULE_S:
        raise UsageError(f"invalid --ramp {text!r}: SECONDS must be > 0 (and at most 30 days)")
    return Ramp(start, end, seconds)


def parse_duration(text: str, flag: str = "--duration") -> float:
    """'60s', '90' (seconds), '500ms', '2m', '1h' -> seconds (> 0)."""
    m = _DURATION_RE.match(text)
    if not m:
        raise UsageError(f"invalid {flag} {text!r}: use e.g. 60s, 500ms, 5m, 1h")
    seconds = float(m.group(1)) * DURATION_UNITS[m.group(2) or "s"]
    if not 0 < seconds <= MAX_SCHEDULE_S:
        raise UsageError(f"invalid {flag} {text!r}: must be > 0 and at most 30 days")
    return seconds


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
    requests: list[WorkloadRequest],
    rate: float,
    burstiness: float,
    process: str,
    seed: int,
    ramp: Ramp | None = None,
) -> np.ndarray:
    if process == "trace":
        if ramp is not None:
            raise UsageError(
                "--ramp cannot reshape a trace's own timestamps: use --arrival "
                "gamma or constant with it"
            )
        times = _trace_times(requests)
    else:
        times = _drawn_times(len(requests), rate, burstiness, process, seed, ramp)
        if ramp is not None and times.size and not math.isfinite(times[-1]):
            raise UsageError(
                f"the ramp falls to 0 req/s after {int(np.isfinite(times).sum())} arrivals: "
                f"{len(requests)} requests never all arrive; lower --num-requests or give "
                "--duration"
            )
    check_schedule_span(times)
    return times


def check_schedule_span(times: np.ndarray, hint: str = "the request rate or the trace's "
                        "arrival_s") -> None:
    """The 30-day limit on an arrival schedule, wherever a schedule is made or reshaped
    (--time-scale multiplies one after it was drawn)."""
    if times.size and not times.max() <= MAX_SCHEDULE_S:
        raise UsageError(
            f"the arrival schedule spans {times.max():.3g} s, more than {MAX_SCHEDULE_S:.0f} s "
            f"(30 days): check {hint}"
        )


class Arrives(Protocol):
    """A trace's item: a request or a session, each with its recorded arrival."""

    @property
    def arrival_s(self) -> float | None: ...


def scale_times(times: np.ndarray, time_scale: float) -> np.ndarray:
    """A trace's offsets as --time-scale sends them (times X): the one rule for the schedule
    (bench/runner.py scale_trace_time) and for --duration's count of it. An overflow is inf,
    which the span check refuses."""
    if time_scale == 1.0:
        return times
    with np.errstate(over="ignore"):
        return times * time_scale


def count_within(
    duration_s: float,
    rate: float,
    burstiness: float,
    process: str,
    seed: int,
    ramp: Ramp | None = None,
    trace: Sequence[Arrives] | None = None,
    time_scale: float = 1.0,
) -> int:
    """How many arrivals of the schedule fall before `duration_s` (for --duration): draw more
    until one lands at or past it. A trace is cut at its first request at or past the duration,
    in file order, on its times scaled by `time_scale` (--time-scale), as they are sent."""
    if process == "trace":
        t = scale_times(_trace_times(trace or []), time_scale)
        late = np.flatnonzero(t >= duration_s)
        return int(late[0]) if late.size else len(t)
    if ramp is None and math.isinf(rate):
        raise UsageError(
            "--duration needs a finite --request-rate (or --ramp): at rate inf everything "
            "arrives at t = 0"
        )
    expected = float(ramp.expected(duration_s)) if ramp is not None else duration_s * rate
    # Before drawing: 30 days at 100,000 req/s would draw 2.6e11 arrivals.
    check_request_count(expected, f"--duration {duration_s:g} s at ~{expected / duration_s:.4g} "
                        f"req/s ({expected:.3g} requests)")
    n = int(expected * DURATION_GUESS_SLACK) + DURATION_GUESS_EXTRA
    while True:
        times = _drawn_times(n, rate, burstiness, process, seed, ramp)
        if times[-1] >= duration_s:
            return int(np.searchsorted(times, duration_s, side="left"))
        n *= 2
        # A tiny --burstiness draws gaps of almost 0 (and rare huge ones): the schedule can
        # take far more arrivals than the rate says to reach the duration, and doubling ran
        # until memory was gone. Each draw is checked as the first one was.
        check_request_count(n, f"--duration {duration_s:g} s with --burstiness {burstiness:g} "
                            f"(at least {n // 2} arrivals before {duration_s:g} s)")


def _trace_times(requests: Sequence[Arrives]) -> np.ndarray:
    t = np.array([r.arrival_s for r in requests], dtype=np.float64)
    return t - t.min() if t.size else t


def _drawn_times(
    n: int, rate: float, burstiness: float, process: str, seed: int, ramp: Ramp | None
) -> np.ndarray:
    """n arrivals of a drawn process; with a ramp, the process at rate 1 (the same random
    stream) mapped through the ramp's L^-1."""
    if ramp is not None:
        if process not in ("constant", "gamma"):
            raise UsageError(f"--ramp needs --arrival gamma or constant, not {process!r}")
        return ramp.time_of(_rate_times(n, 1.0, burstiness, process, seed))
    return _rate_times(n, rate, burstiness, process, seed)


def _rate_times(n: int, rate: float, burstiness: float, process: str, seed: int) -> np.ndarray:
    if math.isinf(rate):
        return np.zeros(n)
    if process == "constant":
        return np.arange(n) / rate
    if not burstiness > 0:
        raise UsageError(f"--burstiness must be > 0, got {burstiness}")
    # A separate stream from request sampling, so changing the rate keeps the same requests.
    # Prefix-consistent: the first k gaps are the same however many are drawn.
    rng = np.random.default_rng([seed, ARRIVAL_RNG_STREAM])
    # Mean gap 1/rate. rate * burstiness overflows for a huge burstiness (1e308: scale 0, every
    # request at t=0); then the scale is formed the other way round. The usual product stays,
    # so every schedule that worked is the same to the bit.
    product = rate * burstiness
    scale = 1.0 / product if math.isfinite(product) else (1.0 / burstiness) / rate
    intervals = rng.gamma(shape=burstiness, scale=scale, size=n)
    return np.concatenate(([0.0], np.cumsum(intervals[:-1])))
