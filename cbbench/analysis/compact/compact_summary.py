"""A CompactRun (analysis/compact/compact_run.py) as the summary's columns (summary/columns.py),
which the one summary (bench/runner._summary: metrics.summarize, slices, steady_state) reads,
for the runs the array simulator serves (the in-process simulator; no
sessions, --cancel-rate, --gpu-profile, speculative decoding or disaggregation; any
--data-parallel-size, --slo, --percentiles, --slice, --warmup/--cooldown).

Per-request figures are the same floats as the object path's: each is computed from the same
token times by the same IEEE operations, and every distribution over requests is numpy's over
the same array in the same (record) order. Pooled per-token figures (itl_ms, event_gap_ms,
windowed and sliced too) come from each replica's step gaps weighted by how many of the
selected requests span each gap (one token per step: request i's gaps are its replica's
consecutive step-end gaps over (first_step, first_step + output - 1]), never from the
expanded array: their count and percentiles are exactly numpy's
(metrics.weighted_distribution), their mean and std equal to float rounding only, since the
weighted sums add in another order than numpy's pairwise sum of the expanded array (relative
difference ~1e-15; the tests allow 1e-9).
"""

from __future__ import annotations

import numpy as np

from cbbench.analysis.compact.compact_run import CompactRun
from cbbench.analysis.summary.columns import MS, NO_TURN, RequestColumns


def compact_columns(run: CompactRun) -> RequestColumns:
    """A compact run's requests as the summary's columns. In-process: the send is the
    intended start, no slot wait, cancel, reasoning or finish reason."""
    req = run.requests
    n = len(req)
    has = (req.first_step >= 0) & (req.output_tokens > 0)
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    for k, ends in enumerate(run.replica_end_s):
        m = has & (req.replica == k)
        first[m] = ends[req.first_step[m]]
        last[m] = ends[req.first_step[m] + req.output_tokens[m] - 1]
    failed = np.zeros(n, dtype=bool)
    failed[list(req.errors)] = True
    no = np.zeros(n, dtype=bool)
    return RequestColumns(
        prompt_tokens=req.prompt_tokens, output_tokens=req.output_tokens,
        priority=req.priority, intended_start_s=req.arrival_s, send_s=req.arrival_s,
        slot_s=np.full(n, np.nan), first_token_s=first, last_token_s=last, failed=failed,
        cancelled=no, error_types={i: req.errors[i][1] for i in sorted(req.errors)},
        max_tokens=req.max_tokens, finish_stop=no, finish_length=no,
        # No reasoning: TTFOT is TTFT (of a completed request, as the records have it).
        ttfot_s=np.where(has & ~failed, first - req.arrival_s, np.nan),
        reasoning_tokens=np.full(n, np.nan), turn=np.full(n, NO_TURN, dtype=np.int64),
        tokens=StepTokens(run),
    )


class StepTokens:
    """A compact run's token times: request i's k-th token came at the end of step
    first_step[i] + k of its replica. One token per step, so every event is one token."""

    one_token_per_event = True

    def __init__(self, run: CompactRun) -> None:
        req = run.requests
        self.ends = run.replica_end_s
        self.n, self.step, self.replica = req.output_tokens, req.first_step, req.replica

    def pooled_gaps_ms(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
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
            ends = self.ends[k]
            gaps = (ends[lo + 1:hi + 1] - ends[lo:hi]) * MS
            keep = cover > 0
            values.append(gaps[keep])
            weights.append(cover[keep])
        if not values:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        return np.concatenate(values), np.concatenate(weights)

    def event_gaps_ms(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        return self.pooled_gaps_ms(rows)

    def tokens_per_event(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        return np.ones(1), np.array([int(self.n[rows].sum())])

    def tokens_between(self, rows: np.ndarray, a: float, b: float) -> int:
        total = 0
        rep = self.replica[rows]
        for k in np.unique(rep):
            sel = rows[rep == k]
            ends = self.ends[k]
            lo, hi = np.searchsorted(ends, a, "left"), np.searchsorted(ends, b, "right")
            s = self.step[sel]
            total += int(np.clip(np.minimum(hi, s + self.n[sel]) - np.maximum(lo, s), 0, None).sum())
        return total

    def slice_tokens(self, rows: np.ndarray, bounds: np.ndarray, n: int) -> np.ndarray:
        tokens = np.zeros(n, dtype=np.int64)
        rep = self.replica[rows]
        for k in np.unique(rep):
            sel = rows[rep == k]
            ends = self.ends[k]
            s = self.step[sel]
            d = (np.bincount(s, minlength=len(ends) + 1)
                 - np.bincount(s + self.n[sel], minlength=len(ends) + 1))
            per_step = np.cumsum(d[:len(ends)])  # requests with a token at each step
            upto = np.concatenate(([0], np.cumsum(per_step)))
            cut = np.concatenate(([0], np.searchsorted(ends, bounds, "left"), [len(ends)]))
            tokens += np.diff(upto[cut])
        return tokens


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
