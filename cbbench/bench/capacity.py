"""Capacity: the highest request rate whose run meets an attainment SLO (see slo.py).

A probe *passes* when its SLO attainment is >= the target and it reached a steady state
(probe.py): a run whose queue was still growing when it ended only met the SLO because it was
short, and says nothing about the rate it was offered.

Search, assuming pass/fail is monotone in the rate (more load never helps latency):
  1. start at a guess (half the saturation rate a rate-inf probe measures, or --start-rate);
  2. bracket: double after a pass, halve after a fail, until there is a passing rate `lo`
     and a failing rate `hi`;
  3. bisect at the geometric mean of lo and hi until (hi - lo) / lo <= precision.
The answer is `lo`, the highest rate seen to pass, with [lo, hi) as its margin. Every probe is
recorded, in order, with its phase.

A probe that met the SLO and failed only as too short to show a steady state (its arrivals
ended during the ramp-up: probe.py) counts as a fail for the search's next step, but it is
no failure of its rate: when such a probe lies between `lo` and the lowest rate that truly
failed, the search ends TOO_SHORT, the capacity at least `lo`, and names that probe. Without
this, 40 requests a probe on the simulated H200 reported 18.59 req/s "found" (19.41 req/s
"fails", at 100% attainment) where probes long enough to judge pass up to ~77 req/s. A probe
with too few requests to judge at all (probe.py's MIN_WINDOW_ARRIVALS) ends the search
TOO_SHORT at once: a lower rate sends no more requests.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from cbbench.bench.probe import RATE_DIGITS, ProbePoint, rate_label, round_rate
from cbbench.errors import UsageError
from cbbench.schema.run import Config

log = logging.getLogger(__name__)

DEFAULT_PRECISION = 0.05
# Probe rates are rounded to RATE_DIGITS significant digits: no bracket is narrower than one
# step of the last digit, up to 10^(1 - RATE_DIGITS) of the rate (at 1.000 -> 1.001).
MIN_PRECISION = 10.0 ** (1 - RATE_DIGITS)
START_FRACTION = 0.5  # of the saturation rate: the first guess
MAX_DOUBLINGS = 10  # up to 1024x the start
MAX_HALVINGS = 10  # down to start / 1024
MAX_PROBES = 30
PROBE_FILES = "probe-*-rate-*.json"  # probe_file's names, as a shell pattern

FOUND = "found"
ABOVE_MAX = "above_max"  # every rate passed up to the ceiling: capacity is at least `lo`
BELOW_MIN = "below_min"  # no rate passed down to the floor
BUDGET = "probe_budget"  # MAX_PROBES ran out before the bracket was tight enough
INTERRUPTED = "interrupted"  # a signal stopped the search: `lo` is the best seen so far
TOO_SHORT = "too_short"  # above `lo`, a probe that met the SLO was too short to judge


@dataclass
class Probe:
    index: int
    phase: str  # bracket | bisect
    point: ProbePoint
    attainment: float | None
    meets_slo: bool
    passed: bool
    interrupted: bool = False  # its run was cut short by a signal: neither pass nor fail
    # Met the SLO, not steady only as its arrivals ended during the ramp-up: not judged.
    too_short: bool = False
    # Its run's --seed (each probe draws its own prompts): `run --seed` at its rate repeats it.
    seed: int | None = None

    def to_dict(self) -> dict:
        return {"index": self.index, "phase": self.phase, "passed": self.passed,
                "meets_slo": self.meets_slo, "attainment": self.attainment,
                "interrupted": self.interrupted, "too_short": self.too_short,
                **self.point.to_dict(), "seed": self.seed}


@dataclass
class SearchResult:
    status: str
    capacity: float | None  # the highest passing rate (None: none passed)
    lo: float | None
    hi: float | None
    probes: list[Probe] = field(default_factory=list)

    @property
    def unjudged(self) -> float | None:
        """The lowest rate above `lo` whose probe met the SLO but was too short to judge."""
        return min((p.point.rate for p in self.probes
                    if p.too_short and (self.lo is None or p.point.rate > self.lo)), default=None)

    @property
    def margin(self) -> float | None:
        """The bracket's width relative to the answer."""
        if self.lo is None or self.hi is None:
            return None
        return (self.hi - self.lo) / self.lo


def parse_precision(precision: float) -> float:
    if not (0 < precision < 1 and math.isfinite(precision)):
        raise UsageError(f"--precision must be in (0, 1) (relative width), got {precision}")
    if precision < MIN_PRECISION:
        raise UsageError(f"--precision must be at least {MIN_PRECISION:g}: probe rates are "
                         f"rounded to {RATE_DIGITS} significant digits, so no bracket is "
                         f"narrower; got {precision:g}")
    return precision


def search(
    probe: Callable[[float, str], Probe],
    start_rate: float,
    precision: float = DEFAULT_PRECISION,
    max_probes: int = MAX_PROBES,
    should_stop: Callable[[], bool] | None = None,
    fits: Callable[[float], bool] | None = None,
) -> SearchResult:
    """Bracket, then bisect. `probe(rate, phase)` runs one probe and returns its record.
    Once ``should_stop`` is set no further probe starts: the search ends INTERRUPTED with the
    best rate seen to pass so far. ``fits(rate)`` says whether a rate can be probed at all
    (ProbeSizing.schedule_fits: its requests sent within the longest schedule): halving stops
    above the first rate that cannot, as at MAX_HALVINGS (a probe there failed the whole
    search with exit 2 after the probes before it, and no capacity file)."""
    if not (start_rate > 0 and math.isfinite(start_rate)):
        raise UsageError(f"the start rate must be a positive number, got {start_rate}")
    probes: list[Probe] = []

    def run(rate: float, phase: str) -> bool:
        if should_stop is not None and should_stop():
            raise _Stopped
        p = probe(rate, phase)
        probes.append(p)
        if p.interrupted:
            raise _Stopped
        if p.too_short and p.point.steady is None:
            raise _TooFew
        return p.passed

    try:
        return _judged(_search(run, start_rate, precision, max_probes, probes, fits or _any_rate))
    except _TooFew:
        lo = _highest_pass(probes)
        return SearchResult(TOO_SHORT, lo, lo, _lowest_failure(probes, lo), probes)
    except _Stopped:
        return stopped(probes)


def stopped(probes: list[Probe]) -> SearchResult:
    """The search ended by a signal after ``probes``: the best rate seen to pass so far. Only
    judged probes bound it: one too short to judge (or cut short) failed nothing."""
    lo = _highest_pass(probes)
    return SearchResult(INTERRUPTED, lo, lo, _lowest_failure(probes, lo), probes)


class _Stopped(Exception):
    """A signal stopped the search."""


class _TooFew(Exception):
    """A probe held too few requests to judge a steady state: as few at every lower rate."""


def _highest_pass(probes: list[Probe]) -> float | None:
    return max((p.point.rate for p in probes if p.passed), default=None)


def _lowest_failure(probes: list[Probe], lo: float | None) -> float | None:
    """The lowest rate above ``lo`` that truly failed (neither too short nor interrupted)."""
    return min((p.point.rate for p in probes if not (p.passed or p.too_short or p.interrupted)
                and (lo is None or p.point.rate > lo)), default=None)


def _any_rate(rate: float) -> bool:
    return True


def _judged(found: SearchResult) -> SearchResult:
    """TOO_SHORT when a probe too short to judge lies above `lo` and below every rate that
    truly failed: its "fail" bounded the answer, and says nothing of its rate; `hi` is then
    the lowest true failure above `lo` (None: none)."""
    unjudged = found.unjudged
    if found.status not in (FOUND, BUDGET, BELOW_MIN) or unjudged is None:
        return found
    hi = _lowest_failure(found.probes, found.lo)
    if hi is not None and hi < unjudged:
        return found
    return SearchResult(TOO_SHORT, found.lo, found.lo, hi, found.probes)


def _search(run, start_rate: float, precision: float, max_probes: int,
            probes: list[Probe], fits: Callable[[float], bool]) -> SearchResult:
    lo = hi = None

    rate = round_rate(start_rate)
    if run(rate, "bracket"):
        lo = rate
        for _ in range(MAX_DOUBLINGS):
            if not math.isfinite(rate * 2):  # a rate past float's range is no rate
                break
            rate = round_rate(rate * 2)
            if not run(rate, "bracket"):
                hi = rate
                break
            lo = rate
        if hi is None:
            return SearchResult(ABOVE_MAX, lo, lo, None, probes)
    else:
        hi = rate
        for _ in range(MAX_HALVINGS):
            rate = round_rate(rate / 2)
            if not (rate > 0 and fits(rate)):
                break
            if run(rate, "bracket"):
                lo = rate
                break
            hi = rate
        if lo is None:
            return SearchResult(BELOW_MIN, None, None, hi, probes)
    while (hi - lo) / lo > precision:
        if len(probes) >= max_probes:
            return SearchResult(BUDGET, lo, lo, hi, probes)
        # Relative precision: halve the bracket in log space.
        mid = round_rate(math.sqrt(lo * hi))
        if not lo < mid < hi:
            break  # as tight as rates rounded to RATE_DIGITS allow
        if run(mid, "bisect"):
            lo = mid
        else:
            hi = mid
    return SearchResult(FOUND, lo, lo, hi, probes)


# ---- running probes -------------------------------------------------------------------------


def probe_file(index: int, rate: float) -> str:
    """The file name of probe ``index``'s full result in --runs-dir (0: the saturation probe)."""
    return f"probe-{index}-rate-{rate_label(rate)}.json"


class Prober:
    """`probe(rate, phase)` for `search`: runs the base RunSpec at the rate and, with runs_dir,
    saves each probe's full result there as probe-<i>-rate-<r>.json. Keeps the first run's
    config (the resolved engine, model and GPU) for the capacity file."""

    def __init__(self, base, sizing, slo, runs_dir=None,
                 should_stop: Callable[[], bool] | None = None, prep=None):
        self.base, self.sizing, self.slo, self.runs_dir = (
            base, sizing, slo, runs_dir
        )
        self.should_stop = should_stop
        self.prep = prep  # bench/point_prep.py: each probe's own prompts, the cache reset
        self.count = 0
        self.config: Config | None = None
        self.probes: list[Probe] = []  # every probe finished: a second signal's file keeps them

    def __call__(self, rate: float, phase: str) -> Probe:
        from cbbench.analysis.result import write_result
        from cbbench.bench.probe import run_probe, summarize_probe

        self.count += 1
        i = self.count
        log.info(
            f"probe {i} ({phase}): rate {rate_label(rate)} req/s, "
            f"{self.sizing.requests_for(rate)} requests"
        )
        result = run_probe(self.base, rate, self.sizing, self.slo,
                           self.should_stop, self.prep)
        if self.config is None:
            self.config = result.config
        path = None
        if self.runs_dir is not None:
            path = self.runs_dir / probe_file(i, rate)
            write_result(path, result)
        point = summarize_probe(rate, result, self.slo, str(path) if path else None)
        meets = point.slo_attainment is not None and point.slo_attainment >= self.slo.attainment
        interrupted = bool(result.interrupted)
        # Passes only in a steady state: one too few requests to judge (steady None) is no
        # evidence that the target keeps up (15 requests a probe passed every rate to 1,600
        # req/s on a target that falls behind above ~77).
        passed = meets and point.steady is True and not interrupted
        too_short = meets and not interrupted and (
            point.steady is None or bool(point.steady_detail.get("too_short")))
        probe = Probe(i, phase, point, point.slo_attainment, meets, passed, interrupted,
                      too_short, result.config.seed)
        self.probes.append(probe)
        return probe
