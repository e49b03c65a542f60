"""The regression gate's logic: metric paths and their direction, thresholds, and verdicts.

A metric is a dotted path into a result's `summary` (`output_throughput`, `ttft_ms.p99`,
`engine.num_preemptions`). A threshold is the largest tolerated move in the bad direction,
relative (`5%`) or absolute in the metric's own unit (`2`), as pytest-benchmark's
`--benchmark-compare-fail` has it.

With one file per side the comparison is exact: the simulator is deterministic, so there is
no noise to allow for. With several files per side the verdict comes from Welch's t confidence
interval of the change in the per-side mean (change_interval), and a metric regresses only when
the whole interval lies past the threshold (a noisy pair whose interval straddles it holds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from cbbench.errors import UsageError
from cbbench.finite import is_finite
from cbbench.schema import RunResult, as_run
from cbbench.schema.base import field_of

HIGHER = "higher"
LOWER = "lower"
# A signed figure whose best is 0: gated on its magnitude (lower |x| is better).
NEARER_ZERO = "lower |x|"

OK = "ok"
REGRESSED = "REGRESSED"
IMPROVED = "improved"

CONFIDENCE = 0.95
# Counts of failures are compared on the per-side mean with no noise interval: a failed
# request is an event to count, not noise to average out ("failed=0": no new failures).
COUNTED_NOT_AVERAGED = frozenset({"failed"})
# A move this close to its limit, relative to the operands' size, is at the limit: by hand
# 0.77 over 0.7 is +10% and 0.85 under 0.9 is 0.05, where float subtraction gives
# 0.10000000000000009 and 0.050000000000000044, which failed a limit of exactly that.
ROUNDING = 1e-12

# Scalars at the top of `summary`, and in its `engine` sub-dict, whose better direction is
# unambiguous. Anything else (e.g. mean_running, KV usage) is a fact, not a goal.
SCALAR_DIRECTIONS = {
    "request_throughput": HIGHER,
    "output_throughput": HIGHER,
    "total_token_throughput": HIGHER,
    "goodput": HIGHER,
    "slo_attainment": HIGHER,
    "completed": HIGHER,
    "failed": LOWER,
    "duration_s": LOWER,
    "engine.num_preemptions": LOWER,
    "engine.mean_iteration_ms": LOWER,
    "engine.num_iterations": LOWER,
    "engine.mean_achieved_bw_gbps": HIGHER,
    "engine.token_budget_utilization": HIGHER,
    "engine.mbu": HIGHER,
}
# Every metric is a count, a rate, a time or a share, none below 0, except the client's send
# lag (a request sent a hair before its intended time). Its best is 0, on schedule: a lag
# turned negative is the client off its schedule the other way, no improvement, so these are
# gated on their magnitude (NEARER_ZERO).
SIGNED_METRICS = ("send_lag_ms",)
# Latency distributions: every statistic is lower-is-better.
LATENCY_DISTRIBUTIONS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "send_lag_ms")
_STAT = re.compile(r"^(mean|std|p\d+(\.\d+)?)$")

# Defaults: the headline throughputs tolerate 5%, tail and median latencies 10%, and no new
# failed request is tolerated at all.
DEFAULT_THRESHOLDS_TEXT = (
    "output_throughput=5%",
    "request_throughput=5%",
    "ttft_ms.p50=10%",
    "ttft_ms.p99=10%",
    "tpot_ms.p50=10%",
    "tpot_ms.p99=10%",
    "itl_ms.p99=10%",
    "e2el_ms.p99=10%",
    "failed=0",
)

# The config keys that define the request set and its arrival schedule: results that differ in
# any of them did not serve the same load, so their numbers do not compare like for like.
# The rest of a config is the system under test (engine, model, scheduler, device, router,
# endpoint, api), how the client sent it (workers, request timeout), what a run reported
# (percentiles, slices; the SLO has its own check) or bookkeeping (label, command); duration_s
# only sizes num_requests, and a replay's workload is its source's.
WORKLOAD_KEYS = (
    "workload", "num_requests", "seed", "request_rate", "burstiness", "arrival",
    # Present only when set (issue 17): a trace's time scale, the random workload's lengths,
    # a multi-turn run's sessions and think time, the cancellation pattern.
    "time_scale", "random", "sessions", "cancel_rate", "cancel_after",
    # A ramp's rates (request_rate is null under one, so two ramps looked alike), a closed
    # loop's cap on requests in flight, random-mm's images per request and an embeddings /
    # rerank run's inputs per request.
    "ramp", "max_concurrency", "images", "batch_size",
)


@dataclass(frozen=True)
class Threshold:
    metric: str
    limit: float  # percent when relative, else in the metric's unit
    relative: bool

    def text(self) -> str:
        return f"{self.limit:g}%" if self.relative else f"{self.limit:g}"


@dataclass(frozen=True)
class Check:
    """One metric's verdict. `change` is relative (0.05 = +5%) for a relative threshold and
    absolute otherwise; `low`/`high` bound it when the verdict came from the interval
    (several runs a side)."""

    metric: str
    direction: str
    baseline: float
    new: float
    change: float
    low: float | None
    high: float | None
    threshold: Threshold
    verdict: str
    n_baseline: int
    n_new: int
    # New runs that completed no request, so have no value for a latency metric (`new` and
    # `change` are then NaN and the verdict REGRESSED: no request got through at all).
    none_completed: int = 0

    @property
    def noise_aware(self) -> bool:
        return self.low is not None


# `slices.worst.<metric>` (--slice results): the worst slice's value of a per-slice figure,
# the lowest throughput or the highest latency statistic over the slices.
WORST_SLICE = "slices.worst."
SLICE_SCALARS = {"request_throughput": HIGHER, "output_throughput": HIGHER, "failed": LOWER,
                 "completed": HIGHER}


def direction_of(metric: str) -> str:
    if metric.startswith(WORST_SLICE):
        inner = metric[len(WORST_SLICE):]
        if inner in SLICE_SCALARS:
            return SLICE_SCALARS[inner]
        head, _, stat = inner.partition(".")
        if head in LATENCY_DISTRIBUTIONS and _STAT.match(stat):
            return LOWER
        raise UsageError(f"unknown metric {metric!r}; per slice: {WORST_SLICE}"
                         f"<{'|'.join(SLICE_SCALARS)}> or {WORST_SLICE}<ttft_ms|tpot_ms|itl_ms|"
                         "e2el_ms>.<mean|pNN>")
    if metric in SCALAR_DIRECTIONS:
        return SCALAR_DIRECTIONS[metric]
    head, _, stat = metric.partition(".")
    if head in LATENCY_DISTRIBUTIONS and _STAT.match(stat):
        return NEARER_ZERO if head in SIGNED_METRICS else LOWER
    known = ", ".join([*SCALAR_DIRECTIONS, *(f"{d}.<mean|std|pNN>" for d in LATENCY_DISTRIBUTIONS),
                       f"{WORST_SLICE}<figure>"])
    raise UsageError(f"unknown metric {metric!r}; known: {known}")


def parse_threshold(text: str) -> Threshold:
    """'ttft_ms.p99=10%' (relative) or 'failed=2' (absolute, in the metric's unit)."""
    metric, sep, value = text.partition("=")
    metric, value = metric.strip(), value.strip()
    usage = "use METRIC=PCT% or METRIC=ABS, e.g. output_throughput=5% or failed=0"
    if not sep or not metric or not value:
        raise UsageError(f"invalid threshold {text!r}: {usage}")
    metric = canonical_metric(metric, text)
    direction_of(metric)  # rejects an unknown metric
    relative = value.endswith("%")
    try:
        limit = float(value[:-1] if relative else value)
    except ValueError:
        raise UsageError(f"invalid threshold value in {text!r}: {usage}") from None
    if not math.isfinite(limit) or limit < 0:
        raise UsageError(f"invalid threshold value in {text!r}: must be a number >= 0")
    return Threshold(metric, limit, relative)


def canonical_metric(metric: str, text: str) -> str:
    """``metric`` with each percentile spelled as a result stores it (percentile_key):
    'ttft_ms.p99.0' is 'ttft_ms.p99' and 'p99.90' 'p99.9', as --percentiles 99.0 keys p99 (read
    as written, they were refused: "did not store it", beside the stored p99). A percentile
    outside [0, 100] is refused here, in one line (numpy raised it as a traceback)."""
    from cbbench.analysis.summary.percentiles import (
        MAX_PERCENTILE,
        MIN_PERCENTILE,
        is_percentile_key,
        percentile_key,
        split_metric_path,
    )

    parts = split_metric_path(metric)
    for i, part in enumerate(parts):
        if not is_percentile_key(part):
            continue
        p = float(part[1:])
        if not MIN_PERCENTILE <= p <= MAX_PERCENTILE:
            raise UsageError(f"invalid threshold {text!r}: the percentile {part} is outside "
                             "[0, 100]")
        parts[i] = percentile_key(p)
    return ".".join(parts)


def default_thresholds(percentiles: Sequence[float] | None = None) -> tuple[str, ...]:
    """The default thresholds; with --percentiles, each default latency's at every percentile
    asked (ttft_ms.p50, ttft_ms.p99.9, ...) instead of its p50 / p99."""
    if percentiles is None:
        return DEFAULT_THRESHOLDS_TEXT
    from cbbench.analysis.summary.percentiles import keys

    latency = [t for t in DEFAULT_THRESHOLDS_TEXT if t.split(".")[0] in LATENCY_DISTRIBUTIONS]
    limits = {t.split(".")[0]: t.rpartition("=")[2] for t in latency}
    others = [t for t in DEFAULT_THRESHOLDS_TEXT if t not in latency]
    return (*others[:2], *(f"{d}.{k}={lim}" for d, lim in limits.items() for k in keys(percentiles)),
            *others[2:])


def thresholds(given: Sequence[str], use_defaults: bool = True,
               percentiles: Sequence[float] | None = None) -> list[Threshold]:
    """The defaults, overridden metric by metric by the given ones (in the order first seen).
    Every distinct limit given for a metric is checked, as pytest-benchmark checks each
    --benchmark-compare-fail (mean:10% and mean:0.02): the later one replaced the earlier."""
    given_checks = list(dict.fromkeys(map(parse_threshold, given)))
    defaults = map(parse_threshold, default_thresholds(percentiles)) if use_defaults else ()
    merged: list[Threshold] = []
    for d in defaults:
        merged += [t for t in given_checks if t.metric == d.metric] or [d]
    merged += [t for t in given_checks if t not in merged]
    if not merged:
        raise UsageError("no metrics to check: give --max-regression METRIC=LIMIT")
    return merged


# The figures a run has only over its completed requests: one that completed none has no value
# for them, which is what it did (every request failed), not a file that cannot be read.
COMPLETED_ONLY = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def needs_a_completed_request(metric: str) -> bool:
    head = metric.removeprefix(WORST_SLICE).split(".", 1)[0]
    return head in COMPLETED_ONLY


def completed_none(result: RunResult | dict, metric: str, path: str) -> bool:
    """Whether ``result`` lacks ``metric`` because it completed no request (its summary says
    completed 0 and the metric is a latency over completed requests)."""
    run = as_run(result, path)
    return needs_a_completed_request(metric) and run.summary.completed == 0 and not _has_value(
        run, metric, path)


def _has_value(run: RunResult, metric: str, path: str) -> bool:
    try:
        metric_value(run, metric, path)
    except UsageError:
        return False
    return True


def metric_value(result: RunResult | dict, metric: str, path: str) -> float:
    """The number ``metric`` (a dotted path into the summary) has in ``result``."""
    from cbbench.analysis.summary.percentiles import split_metric_path

    summary = as_run(result, path).summary
    node: object
    if metric.startswith(WORST_SLICE):
        if summary.slices is None:
            raise UsageError(f"{path} has no time slices for {metric!r}: run with --slice")
        node = worst_slice(summary.slices, split_metric_path(metric[len(WORST_SLICE):]),
                           direction_of(metric) == HIGHER)
    else:
        node = summary
        for part in split_metric_path(metric):
            node = field_of(node, part)
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise UsageError(f"{path} has no value for metric {metric!r}")
    try:
        value = float(node)  # an int of 309+ digits is beyond any float: OverflowError
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):  # was a traceback, exit 1 (the code for "regressed")
        raise UsageError(f"{path} has no value for metric {metric!r}")
    if value < 0 and not metric.startswith(SIGNED_METRICS):
        raise UsageError(f"{path} has {metric} = {node}: it cannot be negative")
    return value


def worst_slice(slices: Sequence[object], path: Sequence[str], higher_is_better: bool
                ) -> float | None:
    """The worst value of a figure over the slices that have one (``path`` into a slice, e.g.
    ['ttft_ms', 'p99']): the lowest throughput, the highest latency."""
    values: list[float] = []
    for s in slices:
        node: object = s
        for part in path:
            node = field_of(node, part)
        if is_finite(node):
            values.append(float(node))
    if not values:
        return None
    return min(values) if higher_is_better else max(values)


# The figures that count requests against the run's --slo: two results held to different SLOs
# measured different things under these names, whatever load they served.
SLO_METRICS = ("goodput", "slo_attainment")


def check_same_slo(results: Sequence[tuple[str, RunResult]], checks: Sequence[Threshold]) -> None:
    """Raise if a threshold reads an SLO figure and the results were held to different SLOs."""
    gated = [t.metric for t in checks if t.metric.split(".", 1)[0] in SLO_METRICS]
    if not gated:
        return
    first_path, first = results[0]
    for path, r in results[1:]:
        if _slo_of(r) != _slo_of(first):
            raise UsageError(
                f"{path} was held to a different SLO from {first_path}: {_slo_text(r)} vs "
                f"{_slo_text(first)}, so {gated[0]} does not compare (rerun one of them with "
                "the other's --slo)"
            )


def _slo_of(r: RunResult) -> tuple:
    """The SLO and the basis it was judged on: under a --max-concurrency cap the TTFT and E2EL
    are judged from the send (summary.slo_basis "send"); a result written before that rule
    judged them from the intended start, a different figure under the same --slo."""
    return r.summary.slo, r.summary.slo_basis


def _slo_text(r: RunResult) -> str:
    slo = r.summary.slo
    text = ",".join(f"{k}={v:g}" for k, v in slo.items()) if slo else "none"
    return f"{text} (TTFT, E2EL from send)" if slo and r.summary.slo_basis else text


def check_same_workload(results: Sequence[tuple[str, RunResult]]) -> None:
    """Raise unless every result served the same request set as the first."""
    first_path, first = results[0]
    for path, r in results[1:]:
        for key in WORKLOAD_KEYS:
            a, b = field_of(first.config, key), field_of(r.config, key)
            if a != b:
                raise UsageError(
                    f"{path} ran a different load from {first_path}: {key} {b!r} vs {a!r} "
                    "(pass --allow-different-workload to compare anyway)"
                )


def _change(base: np.ndarray, new: np.ndarray, relative: bool) -> np.ndarray:
    """new - base, relative to |base| when asked; from a zero baseline any move is infinite."""
    diff = new - base
    if not relative:
        return diff
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = diff / np.abs(base)
    return np.where(base == 0, np.where(diff == 0, 0.0, np.copysign(np.inf, diff)), rel)


def _badness(change: float, direction: str) -> float:
    """How far the change moved in the bad direction (negative: it moved the good way)."""
    return -change if direction == HIGHER else change


def change_interval(
    base: np.ndarray, new: np.ndarray, relative: bool, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Welch's t interval of the change in the per-side mean (the runs are independent, not
    paired, and the sides' noise may differ). A relative change's variance is the delta
    method's over the baseline mean: (n - b)/|b| moves by 1/|b| with the new mean and by
    n/b**2 with the baseline's. A side of one run adds no variance (its noise is unknown).

    Why not a bootstrap: over 3 runs a side a percentile bootstrap's interval (the plug-in
    variance, normal-like quantiles) is far too narrow: runs whose true change sat exactly
    at a 5% limit failed 10.7% of the time where 2.5% is right (6.1% over 5 runs);
    the t quantile with Welch's degrees of freedom holds the rate (tests/analysis/test_gate.py)."""
    from scipy.stats import t as student_t  # where a noisy gate runs, not at import

    b, n = float(base.mean()), float(new.mean())
    change = float(_change(np.array(b), np.array(n), relative))
    if relative and b == 0:  # from a zero baseline any move is infinite (or none)
        return change, change
    scale_new, scale_base = (1 / abs(b), abs(n) / b**2) if relative else (1.0, 1.0)
    parts = [(side.var(ddof=1) / side.size * scale**2, side.size - 1)
             for side, scale in ((new, scale_new), (base, scale_base)) if side.size > 1]
    var = sum(v for v, _ in parts)
    if var == 0:
        return change, change
    dof = var**2 / sum(v**2 / k for v, k in parts if v > 0)
    half = float(student_t.ppf(0.5 + confidence / 2, dof)) * math.sqrt(var)
    return change - half, change + half


def check_metric(
    threshold: Threshold, base_values: Sequence[float], new_values: Sequence[float]
) -> Check:
    direction = direction_of(threshold.metric)
    base = np.asarray(base_values, dtype=np.float64)
    new = np.asarray(new_values, dtype=np.float64)
    if direction == NEARER_ZERO:
        base, new = np.abs(base), np.abs(new)
    limit = threshold.limit / 100 if threshold.relative else threshold.limit
    change = float(_change(np.array(base.mean()), np.array(new.mean()), threshold.relative))
    # A relative change's rounding error scales with 1 + the change; an absolute one's with
    # the values subtracted.
    tol = ROUNDING * (1.0 + limit if threshold.relative
                      else float(np.abs(np.concatenate([base, new])).max(initial=1.0)))
    low = high = None
    best = worst = change
    if (base.size > 1 or new.size > 1) and threshold.metric not in COUNTED_NOT_AVERAGED:
        low, high = change_interval(base, new, threshold.relative)
        # The interval end nearest to "no regression" decides: fail only when even it is past.
        best, worst = (high, low) if direction == HIGHER else (low, high)
    regressed = _badness(best, direction) - limit > tol
    improved = _badness(worst, direction) + limit < -tol
    verdict = REGRESSED if regressed else IMPROVED if improved else OK
    return Check(
        metric=threshold.metric,
        direction=direction,
        baseline=float(base.mean()),
        new=float(new.mean()),
        change=change,
        low=low,
        high=high,
        threshold=threshold,
        verdict=verdict,
        n_baseline=int(base.size),
        n_new=int(new.size),
    )


def comparable_runs(
    baseline: Sequence[tuple[str, RunResult | dict]],
    new: Sequence[tuple[str, RunResult | dict]],
    checks: Sequence[Threshold],
    allow_different_workload: bool = False,
) -> tuple[list[tuple[str, RunResult]], list[tuple[str, RunResult]]]:
    """Each side's results as models, or UsageError where the sides do not compare at all: an
    interrupted run, a different load (unless allowed), SLO figures under different SLOs."""
    base_runs = [(p, as_run(r, p)) for p, r in baseline]
    new_runs = [(p, as_run(r, p)) for p, r in new]
    for path, run in [*base_runs, *new_runs]:
        if run.interrupted:
            raise UsageError(f"{path} is an interrupted run: its figures cover only what finished")
    if not allow_different_workload:
        check_same_workload([*base_runs, *new_runs])
    check_same_slo([*base_runs, *new_runs], checks)
    return base_runs, new_runs


def without_unstored(checks: Sequence[Threshold], results: Sequence[tuple[str, RunResult | dict]],
                     named: Collection[str]) -> tuple[list[Threshold], list[str]]:
    """The checks a gate can make on ``results`` (percentiles already filled from their
    requests), and a warning line for each default one it cannot: a latency percentile a
    result did not store (its run had other --percentiles) and keeps nothing to compute from
    (ITL without --save-detailed's per-token lists, any latency in a --summary-only file). A
    metric in ``named`` (an explicit --max-regression) is not dropped: UsageError, saying why."""
    kept: list[Threshold] = []
    warnings: list[str] = []
    for t in checks:
        why = next(((path, reason) for path, r in results
                    if (reason := _unstored(as_run(r, path), t.metric)) is not None), None)
        if why is None:
            kept.append(t)
        elif t.metric in named:
            raise UsageError(f"{why[0]} has no value for metric {t.metric!r}: it {why[1]}")
        else:
            warnings.append(f"warning: {t.metric} is not gated: {why[0]} {why[1]}")
    return kept, warnings


def _unstored(run: RunResult, metric: str) -> str | None:
    """Why ``run`` has no value for a latency percentile it did not store and cannot compute,
    or None: it has one, or lacks it for another reason (no completed request, no such
    distribution, a file that says it stored the key and has not), which run_gate judges."""
    from cbbench.analysis.summary.percentiles import (
        percentile_key,
        percentile_of,
        split_metric_path,
    )
    from cbbench.schema.run import Distribution

    if metric.startswith(WORST_SLICE):
        return _unstored_in_slices(run, metric)
    if percentile_of(metric) is None:
        return None
    name, key = split_metric_path(metric)
    dist = field_of(run.summary, name)
    if not isinstance(dist, Distribution) or key in (dist.model_extra or {}):
        return None
    if not dist.count and dist.mean is None:  # no values at all (no completed request)
        return None
    asked = run.config.percentiles
    stored = None if asked is None else [percentile_key(p) for p in asked]
    if stored is not None and key in stored:
        return None  # its run stored it: the key was taken out of the file
    ran_with = ("" if stored is None
                else f" (its run's --percentiles: {','.join(k[1:] for k in stored)})")
    source = ("per-token ITL (run with --save-detailed)" if name == "itl_ms"
              else "per-request records (a --summary-only file)" if not run.requests
              else f"request with a {name}")
    return f"did not store it{ran_with} and keeps no {source} to compute it from"


def _unstored_in_slices(run: RunResult, metric: str) -> str | None:
    """``_unstored`` of a slices.worst percentile: why a slice with values lacks it (percentiles
    already filled from the requests where they could be: slice_percentiles.py)."""
    from cbbench.analysis.summary.slice_percentiles import (
        missing_in_slices,
        slice_members,
        slice_percentile_of,
    )

    asked = slice_percentile_of(metric)
    if asked is None or not missing_in_slices(run, *asked):
        return None
    name = asked[0]
    ran = run.config.percentiles
    ran_with = "" if ran is None else f" (its run's --percentiles: {','.join(map(str, ran))})"
    if not run.requests:
        source = "keeps no per-request records (a --summary-only file)"
    elif slice_members(run) is None:
        source = "keeps requests whose end times do not add up to its slices' completed counts"
    elif name == "itl_ms":
        source = "keeps no per-token ITL (run with --save-detailed)"
    else:
        source = f"keeps no request with a {name} for every slice"
    return f"did not store it in its slices{ran_with} and {source} to compute it from"


def run_gate(
    baseline: Sequence[tuple[str, RunResult | dict]],
    new: Sequence[tuple[str, RunResult | dict]],
    checks: Sequence[Threshold],
    allow_different_workload: bool = False,
) -> list[Check]:
    """(path, result) pairs per side -> one Check per threshold. Raises UsageError on input
    that cannot be compared (an interrupted run, a different load, a missing metric)."""
    base_runs, new_runs = comparable_runs(baseline, new, checks, allow_different_workload)
    out = []
    for t in checks:
        for p, r in base_runs:
            if completed_none(r, t.metric, p):
                raise UsageError(
                    f"{p} has no value for metric {t.metric!r}: none of its requests completed, "
                    "so it has no latency to hold the new result to (gate a baseline that "
                    "served its requests)"
                )
        base_values = [metric_value(r, t.metric, p) for p, r in base_runs]
        failed_runs = sum(completed_none(r, t.metric, p) for p, r in new_runs)
        if failed_runs:
            out.append(unmeasured_check(t, base_values, len(new_runs), failed_runs))
            continue
        new_values = [metric_value(r, t.metric, p) for p, r in new_runs]
        out.append(check_metric(t, base_values, new_values))
    return out


def unmeasured_check(threshold: Threshold, base_values: Sequence[float], n_new: int,
                     none_completed: int) -> Check:
    """The verdict on a latency metric that ``none_completed`` of the ``n_new`` new runs have
    no value for, having completed no request: regressed, past any limit."""
    base = np.asarray(base_values, dtype=np.float64)
    return Check(
        metric=threshold.metric,
        direction=direction_of(threshold.metric),
        baseline=float(base.mean()),
        new=math.nan,
        change=math.nan,
        low=None,
        high=None,
        threshold=threshold,
        verdict=REGRESSED,
        n_baseline=int(base.size),
        n_new=n_new,
        none_completed=none_completed,
    )


def passed(checks: Sequence[Check]) -> bool:
    return all(c.verdict != REGRESSED for c in checks)
