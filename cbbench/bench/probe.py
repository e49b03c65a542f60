"""One load probe at a fixed request rate, shared by `sweep` and `capacity`: how many requests
it sends, whether it reached a steady state, and the numbers it is summarized by.

Sizing rule: a probe at rate r sends
    n = min(max_requests, max(num_requests, ceil(r * min_duration_s)))
requests, so every probe has at least `num_requests` samples for its percentiles and, where the
rate allows, `min_duration_s` of arrivals (60 s by default) for queues to settle. A rate-inf probe
(everything at t = 0) sends min(max_requests, num_requests).

Steady-state rule, from the request records alone (so it works for any target), over the
arrival window [0, T] (T = the last intended start). A run starts empty: its in-flight count,
and with it the batch and each request's TPOT, climbs for about one E2EL before it levels
off. The ramp-up R is the RAMP_QUANTILE time from first token to finish of the first
quarter's arrivals (their decode: the wait before the first token is left out, as a queue that
grows from the start lengthens it); a window that compares the run's later part with an
earlier one starts after R, and a run with R > RAMP_LIMIT x T is not steady (its arrivals
ended before it levelled off: too short to show a steady state).
  * throughput: the requests that ARRIVED in [max(T/4, R), 3T/4] (the middle half, less the
    ramp-up) against the requests that COMPLETED in the same span shifted by those arrivals'
    median E2EL d. A server that keeps up completes each request about one E2EL after it
    arrives, so the shifted span completes what the span received; one that falls behind
    completes at its service rate mu < lambda, about mu/lambda of it. What it "received" is
    counted as the shifted span's expected completions had no E2EL depended on when its
    request arrived: each arrival of the run paired with the span's own E2ELs, which is the
    span's arrival count less what the run's edges cut off (a request of long E2EL completes
    in the span only if it arrived early enough). Behind when completed/expected <
    1 - THROUGHPUT_TOLERANCE and the shortfall is more than BEHIND_SIGMAS standard
    deviations of chance. Not judged when fewer than MIN_WINDOW_ARRIVALS arrived in the span.
    (Before, completions in the unshifted middle half were compared with its arrivals: short
    by construction, whatever the load, once E2EL was more than ~0.3 T, and the 10% tolerance
    was within a 45-arrival window's chance.)
  * queueing delay: the slope of TTFT against arrival time over the arrivals in [T/4, T]. A
    server that keeps up gives TTFT no trend; one whose queue grows makes each request wait
    longer than the one before, by lambda/mu - 1 seconds per second of arrivals (FIFO: the
    queue grows at lambda - mu and drains at mu). The same test as throughput's on a signal
    with far less noise than a count (TTFT does not depend on the output's length, nor on the
    batch's TPOT), so a mild overload is seen in a short probe: behind when 1 / (1 + slope) <
    1 - THROUGHPUT_TOLERANCE and the slope is more than BEHIND_SIGMAS standard errors above 0;
  * queue: the mean number of requests in flight (arrived, not finished) over the last quarter
    [3T/4, T] must stay below QUEUE_GROWTH x its mean over a mid window + QUEUE_SLACK; an
    overloaded system's queue grows linearly, a stable one's fluctuates around lambda x E2EL
    (Little's law). The mid window is T/4 long and starts at max(T/4, R), at most T/2. For the
    bundled engine the same test runs on the scheduler's waiting queue (the iteration
    records' num_waiting).
A probe failing any is marked `steady: false` with the reason; its latencies describe a
queue (or a batch) that was still growing when the run ended, not the rate. Rate-inf probes are a burst and
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
from cbbench.schema.run import Iteration

log = logging.getLogger(__name__)

SECONDS_PER_DAY = 86_400.0

DEFAULT_NUM_REQUESTS = 1000  # vLLM's benchmark default; also the size of a rate-inf probe
DEFAULT_MIN_DURATION_S = 60.0
DEFAULT_MAX_REQUESTS = 10_000

THROUGHPUT_WINDOW = (0.25, 0.75)  # of the arrival window; starts no earlier than the ramp-up
TTFT_TREND_WINDOW = (0.25, 1.00)  # after the first quarter's start-up
QUEUE_MID_WINDOW = (0.25, 0.50)  # its earliest place; the ramp-up moves it, up to QUEUE_MID_LATEST
QUEUE_MID_LATEST = 0.50
QUEUE_END_WINDOW = (0.75, 1.00)
# The ramp-up: the in-flight count of a run that starts empty levels off once the first
# arrivals have finished; by this quantile of their decode time, all but a tenth have. The
# queue's mid window is clamped to QUEUE_MID_LATEST: from [T/2, 3T/4] to [3T/4, T] a ramp alone
# raises the mean in flight by at most 0.875 / 0.625 = 1.4x (every request still in flight),
# below QUEUE_GROWTH.
RAMP_QUANTILE = 0.90
# A run whose ramp-up takes more than this share of its arrival window never showed a steady
# state: its arrivals ended while the batch was still filling, and a server falling behind
# looks the same there as one that keeps up (both lengthen each request's E2EL as the batch
# grows). Below it, at least the last quarter of the arrivals came after the ramp-up.
RAMP_LIMIT = 0.75
# A shortfall of completions under 10% is not falling behind (a steady run's counts wander by
# a few percent over a long window, and what is left of the ramp-up still slows the E2EL of
# the first arrivals after it a little); more is ...
THROUGHPUT_TOLERANCE = 0.10
# ... when it is also beyond chance. Each request completes in the shifted span or not; with
# E2ELs independent of arrival time the count is a sum of such Bernoulli trials, of standard
# deviation sqrt(sum p(1 - p)): about sqrt(n) when E2EL varies as much as the span is long (a
# 45-arrival span then wanders by ~15%), near 0 when every request takes the same time. Three
# standard deviations: a run that keeps up is called behind by chance about once in 700 probes
# (the one-sided normal tail), where 10% alone called most short probes behind. The same bar
# for the TTFT slope's standard error.
BEHIND_SIGMAS = 3.0
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
    # R: RAMP_QUANTILE of the first quarter's arrivals' time from first token to finish.
    ramp_up_s: float | None = None
    # The throughput test's span of arrivals, [max(T/4, R), 3T/4], in seconds of the run.
    mid_window_s: list[float] | None = None
    # Requests per second arriving in that span; completing in it shifted by
    # completion_shift_s (the median E2EL of its arrivals); and the completions a server that
    # keeps up would give there (each arrival paired with the span's own E2ELs: the arrival
    # rate, less what the run's edges cut off). Behind by mid_completion_rate /
    # expected_completion_rate. Only the arrival rate when the span held too few to judge.
    mid_arrival_rate: float | None = None
    mid_completion_rate: float | None = None
    expected_completion_rate: float | None = None
    completion_shift_s: float | None = None
    # The standard deviation, in requests, that chance gives the shifted span's completions.
    completion_sd: float | None = None
    # Seconds of TTFT per second of arrival time (the least-squares slope over the arrivals in
    # TTFT_TREND_WINDOW) and its standard error.
    ttft_slope: float | None = None
    ttft_slope_se: float | None = None
    # Mean requests in flight over the queue's mid window and over the last quarter of the
    # arrival window; the same for the engine's waiting queue.
    queue_mid_window_s: list[float] | None = None
    in_flight_mid: float | None = None
    in_flight_end: float | None = None
    waiting_mid: float | None = None
    waiting_end: float | None = None
    # Not steady only because the arrivals ended during the ramp-up: too short to judge the
    # rate, which is no evidence that it overloads the target (a capacity search's bound).
    too_short: bool = False

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _spans(run: RunResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, first token, finish) per request, on the run clock. Failed requests left at an
    unknown time and are dropped; unfinished ones (an interrupted run) stay in flight for ever.
    Without a TTFT the first token is taken at the start."""
    starts, firsts, ends = [], [], []
    for r in run.requests or []:
        if r.intended_start_s is None:
            continue
        if r.error_type == "interrupted":
            starts.append(r.intended_start_s)
            firsts.append(math.inf)
            ends.append(math.inf)
        elif r.error is None and r.e2el_ms is not None:
            starts.append(r.intended_start_s)
            firsts.append(r.intended_start_s + (r.ttft_ms or 0.0) / 1000.0)
            ends.append(r.intended_start_s + r.e2el_ms / 1000.0)
    return (np.asarray(starts, dtype=np.float64), np.asarray(firsts, dtype=np.float64),
            np.asarray(ends, dtype=np.float64))


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


def _ramp_up(starts, firsts, ends, window: float) -> float:
    """R: the RAMP_QUANTILE time from first token to finish of the requests that arrived in
    the first quarter (0 with none): by then the in-flight count of a run that started empty,
    and the batch each request decodes in, have levelled off. From the first token, not the
    arrival: a queue that grows from the start (an overload) lengthens the wait before it, and
    would push every window to the run's end."""
    first = starts < QUEUE_MID_WINDOW[0] * window
    if not first.any():
        return 0.0
    return float(np.quantile(ends[first] - firsts[first], RAMP_QUANTILE))


def _behind(ratio: float, shortfall: float, sd: float) -> bool:
    """Keeping up at under 1 - THROUGHPUT_TOLERANCE of the arrival rate, beyond chance."""
    return ratio < 1 - THROUGHPUT_TOLERANCE and shortfall > BEHIND_SIGMAS * sd


def _ttft_behind(slope: float, se: float) -> bool:
    """A wait that grows by ``slope`` s per s of arrivals: served at 1 / (1 + slope) of them."""
    return slope > 0 and _behind(1 / (1 + slope), slope, se)


@dataclass(frozen=True)
class _Throughput:
    completed: int  # in the span shifted by `shift`
    expected: float  # the same, had no request's E2EL depended on when it arrived
    shift: float
    sd: float  # of `completed` about `expected`, under chance

    @property
    def ratio(self) -> float:
        return self.completed / self.expected if self.expected > 0 else 1.0

    @property
    def behind(self) -> bool:
        return _behind(self.ratio, self.expected - self.completed, self.sd)


def _throughput(starts, ends, lo: float, hi: float) -> _Throughput | None:
    """The completions one median E2EL after the arrivals in [lo, hi) against what a server
    that kept up would have completed there (the module's docstring); None when fewer than
    MIN_WINDOW_ARRIVALS of those arrivals finished."""
    e2el = ends - starts  # inf: an interrupted run's unfinished request
    cohort = np.sort(e2el[(starts >= lo) & (starts < hi) & np.isfinite(e2el)])
    if cohort.size < MIN_WINDOW_ARRIVALS:
        return None
    shift = float(np.median(cohort))
    a, b = lo + shift, hi + shift
    # Each arrival of the run paired with an E2EL drawn from the span's own: the chance p that
    # it completes in [a, b). Summed, the completions expected of a server whose E2EL does not
    # grow with arrival time; the run's edges already in it.
    p = (np.searchsorted(cohort, b - starts, side="left")
         - np.searchsorted(cohort, a - starts, side="left")) / cohort.size
    return _Throughput(
        completed=int(((ends >= a) & (ends < b)).sum()),
        expected=float(p.sum()),
        shift=shift,
        # At least one request's worth: with every p 0 or 1, a shortfall of one is still no
        # evidence.
        sd=math.sqrt(max(float((p * (1 - p)).sum()), 1.0)),
    )


def _ttft_trend(run: RunResult, lo: float, hi: float) -> tuple[float, float] | None:
    """(slope, standard error) of TTFT in seconds against arrival time over the requests that
    arrived in [lo, hi] and have a TTFT; None with too few of them or no spread in time."""
    pts = [(r.intended_start_s, r.ttft_ms / 1000.0) for r in run.requests or []
           if r.error is None and r.intended_start_s is not None and r.ttft_ms is not None
           and lo <= r.intended_start_s <= hi]
    if len(pts) < MIN_WINDOW_ARRIVALS:
        return None
    t, ttft = np.asarray(pts, dtype=np.float64).T
    x = t - t.mean()
    sxx = float((x * x).sum())
    if sxx <= 0:
        return None
    slope = float((x * ttft).sum() / sxx)
    resid = ttft - ttft.mean() - slope * x
    se = math.sqrt(float((resid * resid).sum()) / (len(t) - 2) / sxx)
    return slope, se


def _judge_throughput(check: SteadyCheck, starts, ends, lo: float, hi: float) -> _Throughput | None:
    """The throughput test over the middle half's arrivals after the ramp-up; its figures into
    ``check``."""
    lo = max(lo, check.ramp_up_s or 0.0)
    if lo >= hi:
        return None
    check.mid_window_s = [lo, hi]
    check.mid_arrival_rate = int(((starts >= lo) & (starts < hi)).sum()) / (hi - lo)
    tp = _throughput(starts, ends, lo, hi)
    if tp is not None:
        check.mid_completion_rate = tp.completed / (hi - lo)
        check.expected_completion_rate = tp.expected / (hi - lo)
        check.completion_shift_s = tp.shift
        check.completion_sd = tp.sd
    return tp


def _measure_queue(check: SteadyCheck, run: RunResult, starts, ends, window: float) -> None:
    """Mean in flight (and waiting, from the engine's iterations) over the queue's mid window,
    moved past the ramp-up, and over the last quarter; into ``check``."""
    earliest = QUEUE_MID_WINDOW[0] * window
    mid_lo = min(max(earliest, check.ramp_up_s or 0.0), QUEUE_MID_LATEST * window)
    mid_hi = mid_lo + (QUEUE_MID_WINDOW[1] - QUEUE_MID_WINDOW[0]) * window
    end_lo, end_hi = (f * window for f in QUEUE_END_WINDOW)
    check.queue_mid_window_s = [mid_lo, mid_hi]
    check.in_flight_mid = _window_mean_in_flight(starts, ends, mid_lo, mid_hi)
    check.in_flight_end = _window_mean_in_flight(starts, ends, end_lo, end_hi)
    iterations = run.iterations or []
    if iterations:
        check.waiting_mid = _window_mean_waiting(iterations, mid_lo, mid_hi)
        check.waiting_end = _window_mean_waiting(iterations, end_lo, end_hi)


def _findings(check: SteadyCheck, tp: _Throughput | None) -> list[tuple[str, str]]:
    """(reason, table cell) for each test the run failed."""
    found = []
    window, ramp = check.arrival_window_s or 0.0, check.ramp_up_s or 0.0
    if ramp > RAMP_LIMIT * window:
        found.append((
            f"no steady state: the arrivals ended {window:.3g} s in, before the in-flight count "
            f"had levelled off (the first quarter's arrivals took up to {ramp:.3g} s from first "
            f"token to finish); its latencies describe a batch still filling. More requests "
            f"(--num-requests, --min-duration) make an arrival window several E2ELs long",
            "still ramping up",
        ))
    if tp is not None and tp.behind:
        lo, hi = check.mid_window_s or (0.0, 0.0)
        found.append((
            f"falling behind: {tp.completed} requests completed in the span of arrivals "
            f"{lo:.3g}-{hi:.3g} s shifted by their median E2EL ({tp.shift:.3g} s), against "
            f"{tp.expected:.1f} from a server keeping up "
            f"({(tp.expected - tp.completed) / tp.sd:.1f} standard deviations short): "
            f"{check.mid_completion_rate:.3g} req/s completed vs "
            f"{check.expected_completion_rate:.3g} req/s",
            f"behind {tp.ratio:.2f}x",
        ))
    slope, se = check.ttft_slope, check.ttft_slope_se
    if slope is not None and se is not None and _ttft_behind(slope, se):
        found.append((
            f"queueing delay growing: TTFT rose {slope * 1000:.3g} ms per second of arrivals "
            f"over the last three quarters of the arrival window ({slope / se:.1f} standard "
            f"errors), as a queue served at about {1 / (1 + slope):.2f}x the arrival rate does",
            f"TTFT +{slope:.2f} s/s",
        ))
    mid, end = check.in_flight_mid, check.in_flight_end
    wmid, wend = check.waiting_mid, check.waiting_end
    if mid is not None and end is not None and _grew(mid, end):
        found.append((
            f"queue growing: {end:.1f} requests in flight at the end of the arrival window vs "
            f"{mid:.1f} mid-window",
            f"in flight {mid:.0f}->{end:.0f}",
        ))
    elif wmid is not None and wend is not None and _grew(wmid, wend):
        found.append((
            f"queue growing: {wend:.1f} requests waiting for admission at the end of the "
            f"arrival window vs {wmid:.1f} mid-window",
            f"waiting {wmid:.0f}->{wend:.0f}",
        ))
    return found


def check_steady(result: RunResult | dict, rate: float) -> SteadyCheck:
    if math.isinf(rate):
        return SteadyCheck(None, "a burst (rate inf): no steady state", "burst")
    run = as_run(result, "the probe's result")
    if run.interrupted:
        return SteadyCheck(False, "the run was interrupted before every request finished",
                           "no: interrupted")
    starts, firsts, ends = _spans(run)
    if starts.size == 0:
        return SteadyCheck(None, "no completed requests to judge", "-")
    window = float(starts.max())
    lo, hi = (f * window for f in THROUGHPUT_WINDOW)
    arrived = int(((starts >= lo) & (starts < hi)).sum())
    if arrived < MIN_WINDOW_ARRIVALS or hi <= lo:
        return SteadyCheck(None, f"too few requests ({starts.size}) to judge", "-",
                           arrival_window_s=window)
    check = SteadyCheck(True, arrival_window_s=window,
                        ramp_up_s=_ramp_up(starts, firsts, ends, window))
    tp = _judge_throughput(check, starts, ends, lo, hi)
    trend = _ttft_trend(run, *(f * window for f in TTFT_TREND_WINDOW))
    if trend is not None:
        check.ttft_slope, check.ttft_slope_se = trend
    _measure_queue(check, run, starts, ends, window)
    found = _findings(check, tp)
    if found:
        check.steady = False
        check.too_short = len(found) == 1 and (check.ramp_up_s or 0.0) > RAMP_LIMIT * window
        check.reason = "; ".join(reason for reason, _ in found)
        check.short = "no: " + ", ".join(cell for _, cell in found)
    elif tp is not None:
        check.reason = "throughput kept up with arrivals and the queue did not grow"
        check.short = "yes"
    else:
        check.reason = (
            f"the queue did not grow; throughput not compared: fewer than "
            f"{MIN_WINDOW_ARRIVALS} requests arrived between the ramp-up ({check.ramp_up_s:.3g} "
            f"s, the first arrivals' decode) and 3/4 of the arrival window"
        )
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


def saturation_lower_bound(result: RunResult | dict) -> str | None:
    """Why the rate-inf probe's saturation_rate is only a lower bound, or None. The estimate
    counts the tokens made while requests still waited for their first token; when the last
    first token came before half the requests had finished, that window is the burst's ramp
    (mostly prefill), not a full target: 60 requests on the simulated H200 gave 21 req/s, 300
    gave 49, 1,000 and 3,000 gave 72 and 74 against ~75 sustained."""
    run = as_run(result, "the rate-inf probe's result")
    done = [(r.intended_start_s, r.ttft_ms, r.e2el_ms) for r in run.requests or []
            if r.error is None and r.e2el_ms and r.ttft_ms is not None
            and r.intended_start_s is not None]
    if not done:
        return None
    last_first = max(start + ttft / 1000.0 for start, ttft, _ in done)
    ends = np.array([start + e2el / 1000.0 for start, _, e2el in done], dtype=np.float64)
    median_end = float(np.median(ends))
    if last_first >= median_end:
        return None
    return (f"the rate-inf probe's {len(done)} requests all had their first token by "
            f"{last_first:.3g} s, before half of them finished ({median_end:.3g} s): the target "
            "was never full, so its saturation is a lower bound; more requests "
            "(--num-requests) measure it")


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

    num_requests = result.config.num_requests
    return ProbePoint(
        rate=rate,
        num_requests=int(num_requests if num_requests is not None else len(result.requests or [])),
        completed=int(s.completed or 0),
        failed=int(s.failed or 0),
        achieved_request_rate=float(s.request_throughput or 0.0),
        output_throughput=float(s.output_throughput or 0.0),
        ttft_p50_ms=field_of(s.ttft_ms, "p50"),
        ttft_p99_ms=field_of(s.ttft_ms, "p99"),
        tpot_p50_ms=field_of(s.tpot_ms, "p50"),
        tpot_p99_ms=field_of(s.tpot_ms, "p99"),
        e2el_p50_ms=field_of(s.e2el_ms, "p50"),
        e2el_p99_ms=field_of(s.e2el_ms, "p99"),
        itl_p99_ms=field_of(s.itl_ms, "p99"),
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
    from cbbench.analysis.error_summary import error_lines
    from cbbench.bench.runner import execute_run

    spec = probe_spec(base, rate, sizing, slo)
    resets = warm = None
    if prep is not None:
        spec = prep.spec_for(spec)
        warm = prep.warm_up(spec, should_stop)  # first: the reset then empties what it cached
        resets = prep.before(spec)
    result = execute_run(spec, should_stop=should_stop)
    for line in error_lines(result):  # why this probe's requests failed (its table counts them)
        log.info(f"rate {rate_label(rate)}: {line}")
    if prep is not None:
        prep.after(result)
    if resets is not None:
        result.prefix_cache_reset = resets
    if warm is not None:
        result.warmup_requests = warm
    return result
