"""One load probe at a fixed request rate, shared by `sweep` and `capacity`: how many requests
it sends, whether it reached a steady state, and the numbers it is summarized by.

Sizing rule: a probe at rate r sends
    n = min(max_requests, max(num_requests, ceil(r * min_duration_s)))
requests, so every probe has at least `num_requests` samples for its percentiles and, where the
rate allows, `min_duration_s` of arrivals (60 s by default) for queues to settle. A rate-inf probe
(everything at t = 0) sends min(max_requests, num_requests).

Steady-state rule, from the request records alone (so it works for any target), over the
arrival window [0, T] (T = the last intended start):
  * throughput: requests completed during the middle half [T/4, 3T/4] per second must be at
    least (1 - THROUGHPUT_TOLERANCE) x the requests that arrived in it per second; a system
    that completes fewer than arrive is falling behind;
  * queue: the mean number of requests in flight (arrived, not finished) over the last quarter
    [3T/4, T] must stay below QUEUE_GROWTH x its mean over [T/4, T/2] + QUEUE_SLACK; an
    overloaded system's queue grows linearly, a stable one's fluctuates around lambda x E2EL
    (Little's law). For the bundled engine the same test runs on the scheduler's waiting
    queue (the iteration records' num_waiting).
A probe failing either is marked `steady: false` with the reason; its latencies describe a
queue that was still growing when the run ended, not the rate. Rate-inf probes are a burst and
have no steady state (`steady: null`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from cbbench.analysis.summary.slo import AttainmentSLO, run_attainment
from cbbench.bench.point_prep import PointPrep
from cbbench.errors import UsageError
from cbbench.load.limits import check_request_count
from cbbench.schema import RunResult, as_run
from cbbench.schema.base import field_of
from cbbench.schema.points import ProbePoint, rate_label  # noqa: F401 (re-exported)
from cbbench.schema.run import Distribution, Iteration

log = logging.getLogger(__name__)

SECONDS_PER_DAY = 86_400.0

DEFAULT_NUM_REQUESTS = 1000  # vLLM's benchmark default; also the size of a rate-inf probe
DEFAULT_MIN_DURATION_S = 60.0
DEFAULT_MAX_REQUESTS = 10_000

THROUGHPUT_WINDOW = (0.25, 0.75)  # of the arrival window
QUEUE_MID_WINDOW = (0.25, 0.50)
QUEUE_END_WINDOW = (0.75, 1.00)
THROUGHPUT_TOLERANCE = 0.10
QUEUE_GROWTH = 1.5
QUEUE_SLACK = 4.0  # requests: small queues fluctuate by a few without any trend
QUEUE_SAMPLES = 50  # points per window at which the in-flight count is taken
MIN_WINDOW_ARRIVALS = 10  # fewer in the middle half: too little to judge
RATE_DIGITS = 4


@dataclass(frozen=True)
class ProbeSizing:
    num_requests: int = DEFAULT_NUM_REQUESTS
    min_duration_s: float = DEFAULT_MIN_DURATION_S
    max_requests: int = DEFAULT_MAX_REQUESTS

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise UsageError(f"--num-requests must be >= 1, got {self.num_requests}")
        check_request_count(self.num_requests, f"--num-requests {self.num_requests}")
        if not (self.min_duration_s >= 0 and math.isfinite(self.min_duration_s)):
            raise UsageError(f"--min-duration must be >= 0 seconds, got {self.min_duration_s}")
        if self.max_requests < self.num_requests:
            raise UsageError(
                f"--max-requests ({self.max_requests}) is below --num-requests ({self.num_requests})"
            )

    def requests_for(self, rate: float) -> int:
        if math.isinf(rate):
            return min(self.max_requests, self.num_requests)
        wanted = max(self.num_requests, math.ceil(rate * self.min_duration_s))
        return min(self.max_requests, wanted)

    def schedule_fits(self, rate: float) -> bool:
        """Whether this rate's requests can be sent within the longest schedule a run takes."""
        from cbbench.load.arrivals import MAX_SCHEDULE_S

        return not (math.isfinite(rate) and self.requests_for(rate) / rate > MAX_SCHEDULE_S)

    def check_schedule(self, rate: float, flag: str = "--rates") -> None:
        """Refuse, before any point runs, a rate whose requests would take longer to send than
        any schedule may span (the run itself would refuse it only when its turn came)."""
        from cbbench.load.arrivals import MAX_SCHEDULE_S

        if not self.schedule_fits(rate):
            n = self.requests_for(rate)
            raise UsageError(
                f"{flag}: {n} requests at {rate_label(rate)} req/s take {n / rate:.3g} s to "
                f"send, more than {MAX_SCHEDULE_S:.0f} s ({MAX_SCHEDULE_S / SECONDS_PER_DAY:g} days)"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---- steady state ---------------------------------------------------------------------------


@dataclass
class SteadyCheck:
    steady: bool | None  # None: not applicable (a burst, or too few requests to judge)
    reason: str = ""
    short: str = ""  # for a table cell
    arrival_window_s: float | None = None
    mid_arrival_rate: float | None = None
    mid_completion_rate: float | None = None
    in_flight_mid: float | None = None
    in_flight_end: float | None = None
    waiting_mid: float | None = None
    waiting_end: float | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _spans(run: RunResult) -> tuple[np.ndarray, np.ndarray]:
    """(start, finish) per request, on the run clock. Failed requests left at an unknown time
    and are dropped; unfinished ones (an interrupted run) stay in flight for ever."""
    starts, ends = [], []
    for r in run.requests or []:
        if r.intended_start_s is None:
            continue
        if r.error_type == "interrupted":
            starts.append(r.intended_start_s)
            ends.append(math.inf)
        elif r.error is None and r.e2el_ms is not None:
            starts.append(r.intended_start_s)
            ends.append(r.intended_start_s + r.e2el_ms / 1000.0)
    return np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)


def _window_mean_in_flight(starts, ends, lo: float, hi: float) -> float:
    t = np.linspace(lo, hi, QUEUE_SAMPLES)
    arrived = np.searchsorted(np.sort(starts), t, side="right")
    finished = np.searchsorted(np.sort(ends), t, side="right")
    return float((arrived - finished).mean())


def _window_mean_waiting(iterations: list[Iteration], lo: float, hi: float) -> float | None:
    w = [it.num_waiting for it in iterations
         if it.num_waiting is not None and lo <= it.start_s <= hi]
    return float(np.mean(w)) if w else None


def _grew(mid: float, end: float) -> bool:
    return end > QUEUE_GROWTH * mid + QUEUE_SLACK


def check_steady(result: RunResult | dict, rate: float) -> SteadyCheck:
    if math.isinf(rate):
        return SteadyCheck(None, "a burst (rate inf): no steady state", "burst")
    run = as_run(result, "the probe's result")
    if run.interrupted:
        return SteadyCheck(False, "the run was interrupted before every request finished",
                           "no: interrupted")
    starts, ends = _spans(run)
    if starts.size == 0:
        return SteadyCheck(None, "no completed requests to judge", "-")
    window = float(starts.max())
    lo, hi = (f * window for f in THROUGHPUT_WINDOW)
    arrived = int(((starts >= lo) & (starts < hi)).sum())
    if arrived < MIN_WINDOW_ARRIVALS or hi <= lo:
        return SteadyCheck(None, f"too few requests ({starts.size}) to judge", "-",
                           arrival_window_s=window)
    completed = int(((ends >= lo) & (ends < hi)).sum())
    arrival_rate, completion_rate = arrived / (hi - lo), completed / (hi - lo)
    in_flight_mid = _window_mean_in_flight(starts, ends, *(f * window for f in QUEUE_MID_WINDOW))
    in_flight_end = _window_mean_in_flight(starts, ends, *(f * window for f in QUEUE_END_WINDOW))
    check = SteadyCheck(
        True,
        arrival_window_s=window,
        mid_arrival_rate=arrival_rate,
        mid_completion_rate=completion_rate,
        in_flight_mid=in_flight_mid,
        in_flight_end=in_flight_end,
    )
    iterations = run.iterations or []
    if iterations:
        check.waiting_mid = _window_mean_waiting(iterations, *(f * window for f in QUEUE_MID_WINDOW))
        check.waiting_end = _window_mean_waiting(iterations, *(f * window for f in QUEUE_END_WINDOW))
    reasons, shorts = [], []
    ratio = completion_rate / arrival_rate
    if ratio < 1 - THROUGHPUT_TOLERANCE:
        reasons.append(
            f"falling behind: {completion_rate:.3g} req/s completed vs "
            f"{arrival_rate:.3g} req/s arriving in the middle half of the arrival window"
        )
        shorts.append(f"behind {ratio:.2f}x")
    if _grew(in_flight_mid, in_flight_end):
        reasons.append(
            f"queue growing: {in_flight_end:.1f} requests in flight at the end of the "
            f"arrival window vs {in_flight_mid:.1f} mid-window"
        )
        shorts.append(f"in flight {in_flight_mid:.0f}->{in_flight_end:.0f}")
    elif (
        check.waiting_mid is not None
        and check.waiting_end is not None
        and _grew(check.waiting_mid, check.waiting_end)
    ):
        reasons.append(
            f"queue growing: {check.waiting_end:.1f} requests waiting for admission at the end "
            f"of the arrival window vs {check.waiting_mid:.1f} mid-window"
        )
        shorts.append(f"waiting {check.waiting_mid:.0f}->{check.waiting_end:.0f}")
    if reasons:
        check.steady = False
        check.reason = "; ".join(reasons)
        check.short = "no: " + ", ".join(shorts)
    else:
        check.reason = "throughput kept up with arrivals and the queue did not grow"
        check.short = "yes"
    return check


# ---- saturation -----------------------------------------------------------------------------


def saturation_rate(result: RunResult | dict) -> float:
    """The request rate a target sustains at saturation, from a rate-inf probe.

    Completed / duration undercounts it: the run's tail drains a shrinking batch. Instead, take
    the output tokens produced while requests were still queued (up to the last first token;
    tokens of a request in progress interpolated between its first and last token) per second,
    and divide by the mean output length. Falls back to completed / duration."""
    run = as_run(result, "the rate-inf probe's result")
    fallback = float(run.summary.request_throughput or 0.0)
    done = [r for r in run.requests or [] if r.error is None and r.e2el_ms]
    if not done:
        return fallback
    start = np.array([r.intended_start_s for r in done], dtype=np.float64)
    first = start + np.array([r.ttft_ms for r in done], dtype=np.float64) / 1000.0
    last = start + np.array([r.e2el_ms for r in done], dtype=np.float64) / 1000.0
    out = np.array([r.output_tokens for r in done], dtype=np.float64)
    t_end = float(first.max())
    if t_end <= 0:
        return fallback
    span = np.maximum(last - first, 1e-12)
    progress = np.clip((t_end - first) / span, 0.0, 1.0)
    tokens = float((1 + (out - 1) * progress).sum())
    return tokens / t_end / float(out.mean())


# ---- one probe ------------------------------------------------------------------------------


def round_rate(rate: float) -> float:
    """Computed rates (auto sweeps, capacity probes) to RATE_DIGITS significant digits, so
    the rate in a record is the one in its file name and table row."""
    return rate if math.isinf(rate) else float(f"{rate:.{RATE_DIGITS}g}")


def probe_spec(base, rate: float, sizing: ProbeSizing, slo: AttainmentSLO | None):
    """The base RunSpec at this rate: its request count from the sizing rule, the SLO limits
    for goodput."""
    # repr: the text parses back to this very float. Always a rate, never a trace's own timing:
    # sweep and capacity take gamma or constant arrivals only.
    spec = base.with_load(request_rate=repr(rate), num_requests=sizing.requests_for(rate))
    if slo is not None:  # goodput judges each request against the SLO's limits
        spec = spec.with_output(slo=",".join(f"{k}={v!r}" for k, v in slo.limits_ms.items()))
    return spec


def summarize_probe(
    rate: float, result: RunResult, slo: AttainmentSLO | None, file: str | None = None
) -> ProbePoint:
    s = result.summary
    check = check_steady(result, rate)

    def pct(dist: Distribution | None, p: str) -> float | None:
        return field_of(dist, p)

    num_requests = result.config.num_requests
    return ProbePoint(
        rate=rate,
        num_requests=int(num_requests if num_requests is not None else len(result.requests or [])),
        completed=int(s.completed or 0),
        failed=int(s.failed or 0),
        achieved_request_rate=float(s.request_throughput or 0.0),
        output_throughput=float(s.output_throughput or 0.0),
        ttft_p50_ms=pct(s.ttft_ms, "p50"),
        ttft_p99_ms=pct(s.ttft_ms, "p99"),
        tpot_p50_ms=pct(s.tpot_ms, "p50"),
        tpot_p99_ms=pct(s.tpot_ms, "p99"),
        e2el_p50_ms=pct(s.e2el_ms, "p50"),
        e2el_p99_ms=pct(s.e2el_ms, "p99"),
        itl_p99_ms=pct(s.itl_ms, "p99"),
        goodput=s.goodput,
        slo_attainment=(run_attainment(result, slo.limits_ms) if slo is not None else None),
        steady=check.steady,
        steady_reason=check.reason,
        steady_short=check.short,
        steady_detail=check.to_dict(),
        file=file,
    )


def run_probe(
    base, rate: float, sizing: ProbeSizing, slo: AttainmentSLO | None, should_stop: Callable[[], bool] | None = None,
    prep: PointPrep | None = None,
) -> RunResult:
    """Run the base spec at one rate; returns the result (execute_run's model). With
    ``should_stop`` (a StopSignal) the run stops dispatching once it is set and comes back
    marked interrupted. ``prep``: the point's own prompts and, asked for, the server's prefix
    cache reset first (bench/point_prep.py); the result then says what the reset answered."""
    from cbbench.bench.runner import execute_run

    spec = probe_spec(base, rate, sizing, slo)
    resets = warm = None
    if prep is not None:
        spec = prep.spec_for(spec)
        warm = prep.warm_up(spec, should_stop)  # first: the reset then empties what it cached
        resets = prep.before(spec)
    result = execute_run(spec, should_stop=should_stop)
    if prep is not None:
        prep.after(result)
    if resets is not None:
        result.prefix_cache_reset = resets
    if warm is not None:
        result.warmup_requests = warm
    return result
