"""The run's summary from a CompactRun (analysis/compact/compact_run.py), vectorized: the dict
``bench.runner._summary`` gives for the same run on the object path, for the runs the array
simulator serves (the in-process simulator; no sessions, --cancel-rate, --gpu-profile,
speculative decoding or disaggregation; any --data-parallel-size, --slo, --percentiles,
--slice, --warmup/--cooldown).

Per-request figures are the same floats: each is computed from the same token times by the
same IEEE operations, and every distribution over requests is numpy's over the same array in
the same (record) order. Pooled per-token figures (itl_ms, event_gap_ms, windowed and sliced
too) come from each replica's step gaps weighted by how many of the selected requests span
each gap (one token per step: request i's gaps are its replica's consecutive step-end gaps
over (first_step, first_step + output - 1]), never from the expanded array: their count and
percentiles are exactly numpy's (metrics.weighted_distribution), their mean and std equal
to float rounding only, since the weighted sums add in another order than numpy's pairwise
sum of the expanded array (relative difference ~1e-15; the tests allow 1e-9).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cbbench.analysis.compact.compact_run import CompactRun
from cbbench.analysis.comparison.sim_error import sim_error
from cbbench.analysis.summary.histogram import log_histogram
from cbbench.analysis.summary.metrics import (
    MS,
    distribution,
    run_totals,
    summarize_engine_columns,
    weighted_distribution,
)
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES
from cbbench.analysis.summary.slices import (
    SLICE_LATENCIES,
    in_flight_sorted,
    slice_edges,
    slice_row,
)
from cbbench.analysis.summary.steady_state import (
    METHOD_IN_FLIGHT,
    METHOD_RUNNING,
    steady_state_from,
    steps_from_columns,
    steps_from_sends,
)
from cbbench.analysis.summary.token_counts import SHORT_OUTPUT_WARN_SHARE

LATENCY_NAMES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "event_gap_ms", "tokens_per_event",
                 "ttfot_ms", "reasoning_time_ms", "reasoning_tokens", "reasoning_share")


class CompactView:
    """A compact run's per-request values, computed once (NaN where a request has none)."""

    def __init__(self, run: CompactRun) -> None:
        req = run.requests
        self.run = run
        self.n = req.output_tokens
        self.step = req.first_step
        self.replica = req.replica
        self.arrival = req.arrival_s
        has = (self.step >= 0) & (self.n > 0)
        self.first_t = np.full(len(req), np.nan)
        self.last_t = np.full(len(req), np.nan)
        for k, ends in enumerate(run.replica_end_s):
            m = has & (self.replica == k)
            self.first_t[m] = ends[self.step[m]]
            self.last_t[m] = ends[self.step[m] + self.n[m] - 1]
        self.has_tokens = has
        self.failed = np.zeros(len(req), dtype=bool)
        self.failed[list(req.errors)] = True
        self.ok = has & ~self.failed
        self.ttft_ms = (self.first_t - self.arrival) * MS
        self.e2el_ms = (self.last_t - self.arrival) * MS
        with np.errstate(divide="ignore", invalid="ignore"):
            self.tpot_ms = (self.last_t - self.first_t) / (self.n - 1) * MS
        self.has_tpot = self.ok & (self.n > 1)
        # When the client last saw it (slices) and when it was served (the steady window).
        self.end_s = np.where(has, self.last_t, self.arrival)
        self.served_s = np.where(has, self.first_t, self.arrival)

    def pooled_gaps_ms(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(gap, how many of ``rows`` have it) over every replica's steps: the pooled
        per-token gaps of those requests as a weighted multiset."""
        rows = rows[self.n[rows] >= 2]
        values, weights = [], []
        rep = self.replica[rows]
        for k in np.unique(rep):
            sel = rows[rep == k]
            s, last = self.step[sel], self.step[sel] + self.n[sel] - 1
            lo, hi = int(s.min()), int(last.max())
            span = hi - lo  # gaps lo .. hi - 1: gap j is between steps j and j + 1
            d = np.bincount(s - lo, minlength=span + 1) - np.bincount(last - lo, minlength=span + 1)
            cover = np.cumsum(d[:span])
            ends = self.run.replica_end_s[k]
            gaps = (ends[lo + 1:hi + 1] - ends[lo:hi]) * MS
            keep = cover > 0
            values.append(gaps[keep])
            weights.append(cover[keep])
        if not values:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        return np.concatenate(values), np.concatenate(weights)

    def tokens_between(self, rows: np.ndarray, a: float, b: float) -> int:
        """Tokens of ``rows`` with a time in [a, b]."""
        total = 0
        rep = self.replica[rows]
        for k in np.unique(rep):
            sel = rows[rep == k]
            ends = self.run.replica_end_s[k]
            lo, hi = np.searchsorted(ends, a, "left"), np.searchsorted(ends, b, "right")
            s = self.step[sel]
            total += int(np.clip(np.minimum(hi, s + self.n[sel]) - np.maximum(lo, s), 0, None).sum())
        return total


def latency_distributions_compact(view: CompactView, rows: np.ndarray,
                                  percentiles=DEFAULT_PERCENTILES,
                                  names: Sequence[str] = LATENCY_NAMES,
                                  pooled: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """metrics.latency_distributions of the completed requests ``rows`` (ascending). One
    token per step: every event is one token, so the per-event gaps are the per-token ones
    and tokens_per_event is all ones; no reasoning (TTFOT is TTFT)."""
    out: dict = {}
    if "ttft_ms" in names:
        out["ttft_ms"] = distribution(view.ttft_ms[rows], percentiles)
    if "tpot_ms" in names:
        out["tpot_ms"] = distribution(view.tpot_ms[rows[view.has_tpot[rows]]], percentiles)
    if "itl_ms" in names:
        gaps, weights = pooled if pooled is not None else view.pooled_gaps_ms(rows)
        out["itl_ms"] = weighted_distribution(gaps, weights, percentiles)
    if "e2el_ms" in names:
        out["e2el_ms"] = distribution(view.e2el_ms[rows], percentiles)
    if "event_gap_ms" in names:
        out["event_gap_ms"] = dict(out["itl_ms"])
    if "tokens_per_event" in names:
        out["tokens_per_event"] = weighted_distribution(
            np.ones(1), np.array([int(view.n[rows].sum())]), percentiles)
    if "ttfot_ms" in names:
        out["ttfot_ms"] = distribution(view.ttft_ms[rows], percentiles)
    for name in ("reasoning_time_ms", "reasoning_tokens", "reasoning_share"):
        if name in names:
            out[name] = distribution([], percentiles)
    return out


def check_compact_scope(run: CompactRun, spec) -> None:
    """The runs this summary serves (the module doc); anything else is the object path's."""
    opts = spec.engine
    out = [what for what, bad in (
        ("an endpoint", spec.endpoint is not None),
        ("an engine other than the simulator", getattr(run.resolved, "engine", "sim") != "sim"),
        ("--cancel-rate", spec.load.cancel_rate is not None),
        ("--gpu-profile", opts.gpu_profile is not None),
        ("speculative decoding", bool(opts.speculative_tokens)),
        ("--disaggregate", opts.disaggregate is not None),
    ) if bad]
    if out:
        raise ValueError(f"the compact summary does not serve {', '.join(out)}")


def summarize_compact(run: CompactRun, spec, view: CompactView | None = None) -> dict:
    """``runner._summary(spec, sched, run)`` for the same run (the module doc). ``view``:
    one made already (the request rows take the same one)."""
    from cbbench.analysis.summary.deployment import add_deployment

    check_compact_scope(run, spec)
    view = view if view is not None else CompactView(run)
    pct = spec.percentiles
    ok_rows = np.flatnonzero(view.ok)
    pooled = view.pooled_gaps_ms(ok_rows)
    summary = summarize_view(view, run.duration_s, spec.slo, pct, pooled)
    if spec.slice_s is not None:
        summary["slices"] = compact_slices(view, run.duration_s, spec.slice_s, pct)
    summary["itl_histogram"] = log_histogram(*pooled)
    summary["steady_state"] = compact_steady_state(view, spec.output.warmup,
                                                   spec.output.cooldown, pct)
    if len(run.steps):
        summary["engine"] = compact_engine_summary(run)
    add_deployment(summary, spec.engine, run, [])
    if run.not_sent:
        summary["not_sent"] = run.not_sent
    return summary


def summarize_view(view: CompactView, duration_s: float, slo: dict | None,
                   percentiles=DEFAULT_PERCENTILES, pooled=None) -> dict:
    """metrics.summarize over a compact run."""
    req = view.run.requests
    ok = view.ok
    done = np.flatnonzero(ok)
    out_tokens = int(view.n[done].sum())
    in_tokens = int(req.prompt_tokens[done].sum())
    dur = duration_s if duration_s > 0 else float("inf")
    summary = {
        **run_totals(len(done), len(req.errors), 0, _error_types(req.errors, sorted(req.errors)),
                     duration_s, in_tokens, out_tokens),
        **latency_distributions_compact(view, done, percentiles, pooled=pooled),
        # In-process the send is the intended start: no lag.
        "send_lag_ms": distribution((req.arrival_s - req.arrival_s) * MS, percentiles),
    }
    if len(req):
        summary["short_outputs"] = _short_outputs(view)
    priorities = np.unique(req.priority)
    if len(priorities) > 1:
        summary["per_priority"] = _per_priority(view, priorities)
    if slo:
        good = int(_meets_slo(view, slo).sum())
        summary["slo"] = dict(slo)
        summary["goodput"] = good / dur
        summary["slo_attainment"] = good / len(req) if len(req) else 0.0
    return summary


def _error_types(errors: dict, rows) -> dict:
    out: dict[str, int] = {}
    for i in rows:
        t = errors[i][1] or "error"
        out[t] = out.get(t, 0) + 1
    return out


def _short_outputs(view: CompactView) -> dict:
    """token_counts.short_outputs: in-process there is no finish_reason to tell."""
    mt = view.run.requests.max_tokens
    checked = int(view.ok.sum())
    short = view.ok & (view.n < mt)
    count = int(short.sum())
    return {
        "count": count,
        "share": count / checked if checked else 0.0,
        "mean_shortfall": int((mt[short] - view.n[short]).sum()) / count if count else 0.0,
        "checked": checked,
        "finish_reason_stop": 0,
        "finish_reason_length": 0,
        "warn_share": SHORT_OUTPUT_WARN_SHARE,
    }


def _per_priority(view: CompactView, priorities: np.ndarray) -> dict:
    from cbbench.analysis.summary.metrics import PER_PRIORITY_STATS

    def short(values_ms: np.ndarray) -> dict:
        d = distribution(values_ms, (50, 99))
        return {k: d[k] for k in PER_PRIORITY_STATS}

    out = {}
    prio = view.run.requests.priority
    for p in priorities.tolist():
        mine = prio == p
        done = mine & view.ok
        out[str(p)] = {
            "completed": int(done.sum()),
            "failed": int((mine & view.failed).sum()),
            "ttft_ms": short(view.ttft_ms[done]),
            "tpot_ms": short(view.tpot_ms[done & view.has_tpot]),
        }
    return out


def _meets_slo(view: CompactView, slo: dict[str, float]) -> np.ndarray:
    """metrics.meets_slo per request: completed, and every limit met (no TPOT: passes it)."""
    meets = view.ok.copy()
    checks = {"ttft": (view.ttft_ms, view.ok), "tpot": (view.tpot_ms, view.has_tpot),
              "e2el": (view.e2el_ms, view.ok)}
    for key, limit_ms in slo.items():
        values, known = checks[key]
        meets &= ~(known & (values > limit_ms))
    return meets


def compact_steady_state(view: CompactView, warmup_s: float | None, cooldown_s: float | None,
                         percentiles=DEFAULT_PERCENTILES) -> dict:
    """steady_state.steady_state over a compact run."""
    run = view.run
    if len(run.steps):
        method = METHOD_RUNNING
        cols = run.steps.columns

        def steps():
            return steps_from_columns(cols["start_s"], cols["duration_s"], cols["num_running"])
    else:
        method = METHOD_IN_FLIGHT

        def steps():
            return steps_from_sends(view.arrival, np.where(view.has_tokens, view.last_t,
                                                           view.arrival))
    a = view.arrival
    arrivals = (float(a.min()), float(a.max())) if len(a) else (0.0, 0.0)
    return steady_state_from(
        run.duration_s, method, steps, arrivals, warmup_s, cooldown_s,
        lambda lo, hi: window_figures_compact(view, lo, hi, percentiles),
    )


def window_figures_compact(view: CompactView, a: float, b: float,
                           percentiles=DEFAULT_PERCENTILES) -> dict:
    """steady_state.window_figures over a compact run."""
    req = view.run.requests
    inside = (view.served_s >= a) & (view.served_s <= b)
    done = np.flatnonzero(inside & view.ok)
    span = b - a
    every = np.flatnonzero(view.ok)
    out_tokens = view.tokens_between(every, a, b)
    finished = view.ok & (view.last_t >= a) & (view.last_t <= b)
    in_tokens = int(req.prompt_tokens[finished].sum())
    n_finished = int(finished.sum())
    return {
        "requests": int(inside.sum()),
        "completed": len(done),
        "failed": int((inside & view.failed).sum()),
        "cancelled": 0,
        "duration_s": span,
        "request_throughput": n_finished / span,
        "output_throughput": out_tokens / span,
        "total_token_throughput": (in_tokens + out_tokens) / span,
        **latency_distributions_compact(view, done, percentiles),
    }


def compact_slices(view: CompactView, duration_s: float, slice_s: float,
                   percentiles=DEFAULT_PERCENTILES) -> list[dict]:
    """slices.time_slices over a compact run."""
    req = view.run.requests
    end = view.end_s
    edges = slice_edges(max(duration_s, float(end.max()) if len(end) else 0.0), slice_s)
    bounds = np.asarray(edges[1:-1], dtype=np.float64)
    n = len(edges) - 1
    which = np.searchsorted(bounds, end, side="right")
    order = np.argsort(which, kind="stable")  # each slice's members in record order
    members = np.split(order, np.searchsorted(which[order], np.arange(1, n)))
    tokens = _slice_tokens(view, bounds, n)
    means, peaks = in_flight_sorted(view.arrival, end, edges)
    out = []
    for i in range(n):
        inside = members[i]
        done = inside[view.ok[inside]]
        failed = inside[view.failed[inside]]
        out.append(slice_row(
            edges[i], edges[i + 1], len(done), [req.errors[j][1] for j in failed.tolist()], 0,
            int(tokens[i]), latency_distributions_compact(view, done, percentiles,
                                                          SLICE_LATENCIES),
            means[i], peaks[i],
        ))
    return out


def _slice_tokens(view: CompactView, bounds: np.ndarray, n: int) -> np.ndarray:
    """The completed requests' tokens in each slice, by each token's time (a time on a bound
    is the later slice's)."""
    tokens = np.zeros(n, dtype=np.int64)
    ok = np.flatnonzero(view.ok)
    rep = view.replica[ok]
    for k in np.unique(rep):
        sel = ok[rep == k]
        ends = view.run.replica_end_s[k]
        s = view.step[sel]
        d = (np.bincount(s, minlength=len(ends) + 1)
             - np.bincount(s + view.n[sel], minlength=len(ends) + 1))
        per_step = np.cumsum(d[:len(ends)])  # requests with a token at each step
        upto = np.concatenate(([0], np.cumsum(per_step)))
        cut = np.concatenate(([0], np.searchsorted(ends, bounds, "left"), [len(ends)]))
        tokens += np.diff(upto[cut])
    return tokens


def compact_engine_summary(run: CompactRun) -> dict:
    """runner._engine_summary over the StepTable's columns (no iteration dicts)."""
    gpu_spec = run.resolved.gpu_spec
    engine = summarize_engine_columns(run.steps.columns, gpu_spec)
    engine["kv_blocks_in_use_at_end"] = run.kv_blocks_in_use_at_end
    error, reason = sim_error([], simulated=True)  # the scope: a simulated run
    engine["sim_error"] = error
    if reason is not None:
        engine["sim_error_reason"] = reason
    return engine
