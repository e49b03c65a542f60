"""`--slice DURATION`: the run cut into consecutive time slices, each summarized on its own
(summary.slices), as AIPerf's and GuideLLM's time slices: what a steady average hides (a
server that slowed down after a minute, a burst of errors) shows as one bad slice.

Slices are [k * D, (k + 1) * D) seconds of the run clock (0 = the run's start), the last one
cut at the run's end. A request belongs to the slice it ended in: a completed request's last
token, a failed or cancelled one's last moment the client saw it (its last token, else its
send, else its intended start). So every request is in exactly one slice, and the slices'
``completed``, ``failed``, ``cancelled`` and output tokens add up to the whole run's.

Per slice: ``start_s``, ``end_s``, ``completed``, ``failed``, ``cancelled``, ``error_types``,
``output_tokens`` (the completed requests' tokens, by when each event arrived: a long request
adds to every slice it streamed in), ``request_throughput`` (completed / slice length),
``output_throughput`` (output tokens / slice length), the latency distributions of the
requests that ended in it (TTFT, TPOT, ITL, E2EL: metrics.py, with the run's percentiles), and
``in_flight`` (the time-weighted mean of requests in flight, sent and not ended) with
``in_flight_max``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.columns import RequestColumns, as_columns
from cbbench.analysis.summary.metrics import latency_distributions
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES

MAX_SLICES = 10_000  # a 1 ms slice over an hour's run is a mistake, not a summary
# The shortest --slice, refused before the run: below the client's own timing noise, and
# 1e-7 s cut a 15 s run into 1.5e8 slices, found only once the run was done (and lost).
MIN_SLICE_S = 1e-3
SLICE_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def slice_edges(duration_s: float, slice_s: float) -> list[float]:
    n = max(1, math.ceil(duration_s / slice_s - 1e-9))
    if n > MAX_SLICES:
        from cbbench.errors import UsageError

        raise UsageError(f"--slice {slice_s:g}s cuts this {duration_s:.3g} s run into {n} "
                         f"slices (at most {MAX_SLICES}): give a longer slice")
    return [min(k * slice_s, duration_s) for k in range(n)] + [duration_s]


def time_slices(
    run: RequestColumns | Sequence[RequestRecord], duration_s: float, slice_s: float,
    percentiles=DEFAULT_PERCENTILES,
) -> list[dict]:
    """summary.slices (see the module doc)."""
    cols = as_columns(run)
    end = cols.end_s
    edges = slice_edges(max(duration_s, float(end.max()) if len(end) else 0.0), slice_s)
    bounds = np.asarray(edges[1:-1], dtype=np.float64)
    n = len(edges) - 1
    which = np.searchsorted(bounds, end, side="right")
    order = np.argsort(which, kind="stable")  # each slice's members in row order
    members = np.split(order, np.searchsorted(which[order], np.arange(1, n)))
    tokens = cols.tokens.slice_tokens(np.flatnonzero(cols.ok), bounds, n)
    means, peaks = in_flight(cols.start_s, end, edges)
    out = []
    for i in range(n):
        inside = members[i]
        done = inside[cols.ok[inside]]
        failed = inside[cols.failed[inside]]
        out.append(slice_row(
            edges[i], edges[i + 1], len(done), [cols.error_types[j] for j in failed.tolist()],
            int(cols.cancelled[inside].sum()), int(tokens[i]),
            latency_distributions(cols, done, percentiles, SLICE_LATENCIES), means[i], peaks[i],
        ))
    return out


def slice_row(a: float, b: float, completed: int, failed_types: Sequence[str | None],
              cancelled: int, tokens: int, dists: dict, in_flight: float,
              in_flight_max: int) -> dict:
    """One entry of summary.slices (``failed_types``: each failed request's error_type)."""
    span = b - a if b > a else math.inf
    errors: dict[str, int] = {}
    for t in failed_types:
        errors[t or "error"] = errors.get(t or "error", 0) + 1
    return {
        "start_s": a,
        "end_s": b,
        "completed": completed,
        "failed": len(failed_types),
        "cancelled": cancelled,
        "error_types": errors,
        "output_tokens": tokens,
        "request_throughput": completed / span,
        "output_throughput": tokens / span,
        **{k: dists[k] for k in SLICE_LATENCIES},
        "in_flight": in_flight,
        "in_flight_max": in_flight_max,
    }


def in_flight(starts: np.ndarray, ends: np.ndarray, edges: Sequence[float]
              ) -> tuple[list, list]:
    """Time-weighted mean and max of requests in flight (sent and not ended), per slice. The
    peak is reached at some request's start inside the slice (or at its opening); the count
    in flight at t is #(start <= t) - #(end <= t), which is #(start <= t < end) since no
    request ends before it starts (its end is its last token, else its send)."""
    s_sorted, e_sorted = np.sort(starts), np.sort(ends)
    means, peaks = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        span = b - a
        overlap = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None)
        means.append(float(overlap.sum() / span) if span > 0 else 0.0)
        lo, hi = np.searchsorted(s_sorted, [a, b], side="left")
        points = np.concatenate(([a], s_sorted[lo:hi]))
        live = (np.searchsorted(s_sorted, points, side="right")
                - np.searchsorted(e_sorted, points, side="right"))
        peaks.append(int(live.max()))
    return means, peaks
