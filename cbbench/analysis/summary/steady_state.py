"""The steady-state window of a run: its ramp-up and drain left out.

A benchmark's first seconds fill an empty server and its last ones empty it again; neither is
the load the run was meant to measure. Every summary therefore also reports a window and the
figures within it (summary.steady_state), chosen one of two ways:

- ``--warmup W --cooldown C``: the window is [W, duration - C] seconds of the run clock.
- detected (the default), from the running-request count c(t): the in-process engine's own
  count of running requests per iteration (``running_requests``; with data-parallel replicas
  or disaggregated instances, the sum of each engine's count), or, for an endpoint, the
  client's count of requests in flight (``in_flight_requests``). The level L is the
  time-weighted median of c(t) while requests were still arriving (the whole run when they
  all arrived at once). The window opens the first time c(t) reaches ``LEVEL_FRACTION`` * L
  and closes the last time it is there, and no later than the last arrival (under
  ``--max-concurrency``, the last request's slot): after it the run can only drain.

Within the window [a, b]: latencies (TTFT, TPOT, ITL, E2EL) over the requests served in it
(first token within it; a request that got none, by its intended start), so a run whose
requests all arrived at t = 0 still has its saturated middle measured; throughputs over what
happened in it (output tokens streamed, requests completed, per second of the window). Output
tokens are counted as ``--slice`` counts them (TokenTimes.tokens_between): an HTTP stream event
of k tokens is k tokens at its time, not one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.columns import RequestColumns, as_columns
from cbbench.analysis.summary.metrics import DEFAULT_PERCENTILES, latency_distributions

LEVEL_FRACTION = 0.9  # within 10% of the steady level counts as "at it"
MIN_WINDOW_REQUESTS = 10  # fewer started in the window: the figures are reported, with a note
METHOD_WARMUP = "warmup_cooldown"
METHOD_RUNNING = "running_requests"
METHOD_IN_FLIGHT = "in_flight_requests"


def steps_from_iterations(iterations: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(edges, values): c = values[i] on [edges[i], edges[i + 1]), the deployment's running
    count from its iteration records' columns (metrics.engine_columns, or a compact run's
    StepTable). One engine: its own step function (engine_steps). Several (data-parallel
    replicas, a disaggregated run's prefill and decode instances: the ``replica`` and ``pool``
    columns tell them apart): each engine's own step function, summed, so the count at a time
    is every engine's requests then, not the count of whichever engine last started an
    iteration."""
    start = np.asarray(iterations["start_s"], dtype=np.float64)
    dur = np.asarray(iterations["duration_s"], dtype=np.float64)
    running = np.asarray(iterations["num_running"], dtype=np.float64)
    engines = _engines(iterations, len(start))
    if engines is None:
        return engine_steps(start, dur, running)
    return _summed([engine_steps(start[k], dur[k], running[k]) for k in engines])


def engine_steps(start: np.ndarray, dur: np.ndarray,
                 running: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One engine's step function: its iterations in start order; before one that starts
    after every earlier one has ended, an idle gap at 0 from that end (the run's start for the
    first)."""
    if (start[1:] < start[:-1]).any():  # the engine lists them in start order: no copies then
        order = np.argsort(start, kind="stable")
        start, dur, running = start[order], dur[order], running[order]
    end = start + dur
    reached = np.maximum.accumulate(np.concatenate(([0.0], end)))  # [i]: before iteration i
    idle = np.flatnonzero(start > reached[:-1])
    edges = np.insert(start, idle, reached[idle])  # an idle gap (count 0) before each
    values = np.insert(running, idle, 0.0)
    return np.append(edges, reached[-1]), values


ENGINE_LABELS = ("pool", "replica")  # the iteration columns that name the engine that ran it


def _engines(iterations: Mapping[str, np.ndarray], n: int) -> list[np.ndarray] | None:
    """Each engine's iteration indices (in record order), or None where one engine ran them
    all (no label column, or one value in each)."""
    code = np.zeros(n, dtype=np.int64)
    for name in ENGINE_LABELS:
        if name not in iterations:
            continue
        labels = np.asarray(iterations[name])
        if labels.dtype == object:  # a pool's name, or None: compared as text
            labels = labels.astype(str)
        kinds, which = np.unique(labels, return_inverse=True)
        code = code * len(kinds) + which.reshape(-1)
    engines = np.unique(code)
    if len(engines) < 2:
        return None
    return [np.flatnonzero(code == e) for e in engines]


def _summed(steps: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of step functions (each 0 outside its own edges), on the union of their
    edges."""
    edges = np.unique(np.concatenate([e for e, _ in steps]))
    total = np.zeros(len(edges) - 1)
    for e, v in steps:
        # The step of this engine's that holds each union interval's start: at equal edges
        # (a zero-length step) the last, the one that lasts.
        at = np.searchsorted(e, edges[:-1], side="right") - 1
        inside = (at >= 0) & (at < len(v))
        total[inside] += v[at[inside]]
    return edges, total


def steps_from_requests(cols: RequestColumns) -> tuple[np.ndarray, np.ndarray]:
    """The client's count of requests in flight: each sent request from its send to its end."""
    sent = cols.sent
    sends, ends = cols.send_s[sent], cols.end_s[sent]
    if len(sends) == 0:
        return np.zeros(1), np.zeros(0)
    times = np.concatenate((sends, ends))
    deltas = np.concatenate((np.ones(len(sends)), -np.ones(len(sends))))
    order = np.lexsort((deltas, times))  # at equal times, ends (-1) before starts
    times, counts = times[order], np.cumsum(deltas[order])
    return np.concatenate(([0.0], times)), np.concatenate(([0.0], counts[:-1]))[: len(times)]


def _weighted_median(edges: np.ndarray, values: np.ndarray, a: float, b: float) -> float:
    lo, hi = np.clip(edges[:-1], a, b), np.clip(edges[1:], a, b)
    w = hi - lo
    if w.sum() <= 0:
        return float(values.max()) if values.size else 0.0
    order = _stable_order(values)
    cum = np.cumsum(w[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])


def _stable_order(values: np.ndarray) -> np.ndarray:
    """np.argsort(values, kind="stable"). Running counts are small whole numbers: as int16
    numpy radix-sorts them, the same permutation in O(n) (a million-request run has ~4M)."""
    if values.size and values.min() >= 0 and values.max() < 2**15 and (
            np.floor(values) == values).all():
        return np.argsort(values.astype(np.int16), kind="stable")
    return np.argsort(values, kind="stable")


def detect_window(
    edges: np.ndarray, values: np.ndarray, first_arrival: float, last_arrival: float
) -> tuple[float, float, dict] | None:
    """(start, end, detail) from a step function of the running count, or None."""
    if values.size == 0 or values.max() <= 0:
        return None
    end_of_run = float(edges[-1])
    spread = last_arrival > first_arrival
    a, b = (first_arrival, last_arrival) if spread else (0.0, end_of_run)
    level = _weighted_median(edges, values, a, b)
    if level <= 0:  # mostly idle: one request at a time at most
        level = float(values.max())
    threshold = LEVEL_FRACTION * level
    at_level = np.flatnonzero(values >= threshold)
    start = float(edges[at_level[0]])
    end = float(edges[at_level[-1] + 1])
    if spread:
        end = min(end, last_arrival)
    if end <= start:
        return None
    return start, end, {"level": level, "threshold": threshold, "arrivals_end_s": last_arrival}


def window_figures(
    run: RequestColumns | Sequence[RequestRecord], a: float, b: float,
    percentiles=DEFAULT_PERCENTILES,
) -> dict:
    cols = as_columns(run)
    served = cols.served_s
    inside = (served >= a) & (served <= b)
    done = np.flatnonzero(inside & cols.ok)
    span = b - a
    # A request with no output (embeddings, rerank: its one time is the answer's) streams none.
    out_tokens = cols.tokens.tokens_between(np.flatnonzero(cols.ok & (cols.output_tokens > 0)),
                                            a, b)
    finished = cols.ok & (cols.last_token_s >= a) & (cols.last_token_s <= b)
    in_tokens = int(cols.prompt_tokens[finished].sum())
    return {
        "requests": int(inside.sum()),
        "completed": len(done),
        "failed": int((inside & cols.failed).sum()),
        "cancelled": int((inside & cols.cancelled).sum()),
        "duration_s": span,
        "request_throughput": int(finished.sum()) / span,
        "output_throughput": out_tokens / span,
        "total_token_throughput": (in_tokens + out_tokens) / span,
        **latency_distributions(cols, done, percentiles),
    }


def steady_state(
    run: RequestColumns | Sequence[RequestRecord],
    duration_s: float,
    iterations: Mapping[str, np.ndarray] | None = None,
    warmup_s: float | None = None,
    cooldown_s: float | None = None,
    percentiles=DEFAULT_PERCENTILES,
) -> dict:
    """summary.steady_state: the window, how it was chosen, and its figures. ``iterations``:
    the engine's iteration records as columns (steps_from_iterations)."""
    cols = as_columns(run)
    detail: dict = {}
    if warmup_s is not None or cooldown_s is not None:
        method = METHOD_WARMUP
        a, b = warmup_s or 0.0, duration_s - (cooldown_s or 0.0)
        detail = {"warmup_s": warmup_s or 0.0, "cooldown_s": cooldown_s or 0.0}
        window = (a, b) if b > a else None
    else:
        if iterations is not None and len(iterations["start_s"]):
            method = METHOD_RUNNING
            edges, values = steps_from_iterations(iterations)
        else:
            method = METHOD_IN_FLIGHT
            edges, values = steps_from_requests(cols)
        starts = cols.intended_start_s
        # Under --max-concurrency a request waiting for a slot is load still to come: the run
        # drains only once the last one got its slot (it closed at the last intended arrival,
        # while the closed loop kept its cap in flight for seconds after).
        ready = np.where(np.isnan(cols.slot_s), starts, cols.slot_s)
        arrivals = (float(starts.min()), float(ready.max())) if len(starts) else (0.0, 0.0)
        found = detect_window(edges, values, arrivals[0], arrivals[1])
        window = found[:2] if found else None
        detail = found[2] if found else {}
    out: dict = {"window_s": list(window) if window else None, "method": method, **detail}
    if window is None:
        out["note"] = (
            f"empty window: --warmup/--cooldown leave nothing of the {duration_s:.3g} s run"
            if method == METHOD_WARMUP
            else "no steady level found (nothing ran)"
        )
        return out
    got = window_figures(cols, window[0], window[1], percentiles)
    if got["requests"] < MIN_WINDOW_REQUESTS:
        out["note"] = (
            f"only {got['requests']} requests served in the window: its figures are noisy"
        )
    out.update(got)
    return out
