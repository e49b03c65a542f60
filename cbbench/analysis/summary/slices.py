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
from cbbench.analysis.summary.metrics import latency_distributions
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES

MAX_SLICES = 10_000  # a 1 ms slice over an hour's run is a mistake, not a summary
SLICE_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def end_s(r: RequestRecord) -> float:
    """When a request ended, as far as the client knows."""
    if r.token_times_s:
        return r.token_times_s[-1]
    return r.send_s if r.send_s is not None else r.intended_start_s


def _start_s(r: RequestRecord) -> float:
    return r.send_s if r.send_s is not None else r.intended_start_s


def slice_edges(duration_s: float, slice_s: float) -> list[float]:
    n = max(1, math.ceil(duration_s / slice_s - 1e-9))
    if n > MAX_SLICES:
        from cbbench.errors import UsageError

        raise UsageError(f"--slice {slice_s:g}s cuts this {duration_s:.3g} s run into {n} "
                         f"slices (at most {MAX_SLICES}): give a longer slice")
    return [min(k * slice_s, duration_s) for k in range(n)] + [duration_s]


def _token_counts(r: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(event times, tokens) of a completed request, the tokens adding up to its output count
    (a count the events did not carry goes to the last event)."""
    times, counts = r.events()
    k = np.asarray(counts, dtype=np.int64).copy()
    if k.size:
        k[-1] += r.output_tokens - int(k.sum())
    return np.asarray(times, dtype=np.float64), k


def _in_flight(records: Sequence[RequestRecord], edges: Sequence[float]) -> tuple[list, list]:
    """Time-weighted mean and max of requests in flight, per slice."""
    starts = np.array([_start_s(r) for r in records], dtype=np.float64)
    ends = np.array([end_s(r) for r in records], dtype=np.float64)
    means, peaks = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        span = b - a
        overlap = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None)
        means.append(float(overlap.sum() / span) if span > 0 else 0.0)
        # The peak is reached at some request's start inside the slice (or at its opening).
        points = np.concatenate(([a], starts[(starts >= a) & (starts < b)]))
        live = [int(((starts <= t) & (ends > t)).sum()) for t in points]
        peaks.append(max(live))
    return means, peaks


def time_slices(
    records: Sequence[RequestRecord], duration_s: float, slice_s: float,
    percentiles=DEFAULT_PERCENTILES,
) -> list[dict]:
    """summary.slices (see the module doc)."""
    edges = slice_edges(max(duration_s, max((end_s(r) for r in records), default=0.0)), slice_s)
    bounds = np.asarray(edges[1:-1], dtype=np.float64)

    def which(t: float) -> int:
        return int(np.searchsorted(bounds, t, side="right"))

    n = len(edges) - 1
    members: list[list[RequestRecord]] = [[] for _ in range(n)]
    tokens = np.zeros(n, dtype=np.int64)
    for r in records:
        members[which(end_s(r))].append(r)
        if r.ok:
            times, k = _token_counts(r)
            np.add.at(tokens, np.searchsorted(bounds, times, side="right"), k)
    means, peaks = _in_flight(records, edges)
    out = []
    for i in range(n):
        inside = members[i]
        done = [r for r in inside if r.ok]
        failed = [r for r in inside if r.error is not None]
        out.append(slice_row(
            edges[i], edges[i + 1], len(done), [r.error_type for r in failed],
            sum(1 for r in inside if r.cancelled), int(tokens[i]),
            latency_distributions(done, percentiles), means[i], peaks[i],
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


def in_flight_sorted(starts: np.ndarray, ends: np.ndarray, edges: Sequence[float]
                     ) -> tuple[list, list]:
    """``_in_flight`` without its quadratic peak search (a compact run's million requests):
    the mean is the same sum over the requests in order; the count in flight at t is
    #(start <= t) - #(end <= t), which is #(start <= t < end) since no request ends before it
    starts (its end is its last token, else its send)."""
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
