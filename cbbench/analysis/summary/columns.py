"""The summary's one input: a run's requests as numpy columns (one row per request, in the
order the run lists them), and their token times behind a small interface.

Two forms of a run become these columns:

- ``request_columns(records)``: the object path's RequestRecords (any target: the in-process
  engine, HTTP). Token times are held ragged (every request's times, events and gaps, one
  flat array each), so every figure is the same float the per-record code gave: the same
  IEEE operations on the same values, pooled in record order.
- ``compact_columns(run)`` (analysis/compact/compact_summary.py): the array simulator's
  CompactRun, whose token times are slices of each replica's step end times; its pooled
  per-token gaps are step gaps weighted by how many requests span them (never expanded).

metrics.summarize, steady_state, slices and turns then read only these columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cbbench.analysis.records import RequestRecord

MS = 1000.0
NO_TURN = -1  # the turn column where a request is no session's
NOT_ASKED = -1  # the max_tokens column where the request asked none


class TokenTimes(Protocol):
    """A run's token times, asked only what the summary needs. ``rows``: ascending row
    indices (completed requests where the figures say so)."""

    # Every stream event is one token (event gaps are the per-token gaps, one token each).
    one_token_per_event: bool

    def pooled_gaps_ms(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The per-token gaps of ``rows``, pooled: (values, None) expanded in row order, or
        (values, weights): value j occurs weights[j] times."""
        ...

    def event_gaps_ms(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The gaps between stream events, pooled as ``pooled_gaps_ms``."""
        ...

    def tokens_per_event(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens of each stream event, pooled as ``pooled_gaps_ms``."""
        ...

    def tokens_between(self, rows: np.ndarray, a: float, b: float) -> int:
        """Output tokens of ``rows`` whose stream events came in [a, b]: each event counted by
        its tokens, as ``slice_tokens`` counts them (not one per event)."""
        ...

    def slice_tokens(self, rows: np.ndarray, bounds: np.ndarray, n: int) -> np.ndarray:
        """Output tokens of ``rows`` per slice (``bounds``: the n - 1 inner edges; a time on
        a bound is the later slice's), each request's count adding up to its output."""
        ...


@dataclass
class RequestColumns:
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    priority: np.ndarray  # int64
    intended_start_s: np.ndarray  # float64: the arrival schedule
    send_s: np.ndarray  # float64; NaN: never sent
    slot_s: np.ndarray  # float64; NaN: no slot wait (--max-concurrency)
    first_token_s: np.ndarray  # float64; NaN: no token
    last_token_s: np.ndarray  # float64; NaN: no token
    failed: np.ndarray  # bool: an error
    cancelled: np.ndarray  # bool: the client gave up on it
    error_types: dict[int, str | None]  # failed row -> its error_type
    max_tokens: np.ndarray  # int64; NOT_ASKED
    finish_stop: np.ndarray  # bool: finish_reason "stop"
    finish_length: np.ndarray  # bool: finish_reason "length"
    ttfot_s: np.ndarray  # float64: time to the first output token; NaN: none
    reasoning_tokens: np.ndarray  # float64; NaN: unknown
    turn: np.ndarray  # int64; NO_TURN
    tokens: TokenTimes
    # The object path's records, for what only they hold (the server's prefix-cache counts).
    records: Sequence[RequestRecord] | None = None
    # Derived (__post_init__): per-request latencies, NaN where a request has none.
    has_tokens: np.ndarray = field(init=False)
    ok: np.ndarray = field(init=False)
    ttft_ms: np.ndarray = field(init=False)
    e2el_ms: np.ndarray = field(init=False)
    tpot_ms: np.ndarray = field(init=False)
    has_tpot: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.has_tokens = ~np.isnan(self.first_token_s)
        self.ok = self.has_tokens & ~self.failed & ~self.cancelled
        # The records' properties, the same IEEE operations: (t - start) * MS ...
        self.ttft_ms = (self.first_token_s - self.intended_start_s) * MS
        self.e2el_ms = (self.last_token_s - self.intended_start_s) * MS
        with np.errstate(divide="ignore", invalid="ignore"):  # ... (last - first) / (n - 1)
            self.tpot_ms = (self.last_token_s - self.first_token_s) / (self.output_tokens - 1) * MS
        self.has_tpot = self.ok & (self.output_tokens > 1)

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def sent(self) -> np.ndarray:
        return ~np.isnan(self.send_s)

    @property
    def start_s(self) -> np.ndarray:
        """When the client sent it (else its intended start)."""
        return np.where(self.sent, self.send_s, self.intended_start_s)

    @property
    def end_s(self) -> np.ndarray:
        """When it ended as far as the client knows: its last token, else its send, else
        its intended start."""
        return np.where(self.has_tokens, self.last_token_s, self.start_s)

    @property
    def served_s(self) -> np.ndarray:
        """When it was served: its first token, else its intended start."""
        return np.where(self.has_tokens, self.first_token_s, self.intended_start_s)

    def error_types_of(self, rows: np.ndarray) -> dict[str, int]:
        """How many of the failed ``rows`` had each error type (in row order)."""
        out: dict[str, int] = {}
        for i in rows.tolist():
            t = self.error_types[i] or "error"
            out[t] = out.get(t, 0) + 1
        return out


def as_columns(run: RequestColumns | Sequence[RequestRecord]) -> RequestColumns:
    """Columns as they are; records converted (request_columns)."""
    return run if isinstance(run, RequestColumns) else request_columns(run)


def _nan(v: float | None) -> float:
    return np.nan if v is None else v


def request_columns(records: Sequence[RequestRecord]) -> RequestColumns:
    """The object path's records as columns: the one conversion."""
    n = len(records)
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    per_token: list[np.ndarray] = []
    per_event: list[np.ndarray] = []
    event_t: list[np.ndarray] = []
    event_k: list[np.ndarray] = []
    slice_k: list[np.ndarray] = []
    for i, r in enumerate(records):
        t = r.token_times_s
        if t:
            first[i], last[i] = t[0], t[-1]
        et, k = r.event_arrays()
        a, b = _gaps_s(et, k)
        per_token.append(a)
        per_event.append(b)
        event_k.append(k)
        # Each event's output tokens, as the slices and the steady window count them
        # (RaggedTokens.counted_events): what the events did not carry goes last.
        counts = k.astype(np.int64)
        if counts.size:
            counts[-1] += r.output_tokens - int(counts.sum())
        event_t.append(et)
        slice_k.append(counts)
    return RequestColumns(
        prompt_tokens=np.array([r.prompt_tokens for r in records], dtype=np.int64),
        output_tokens=np.array([r.output_tokens for r in records], dtype=np.int64),
        priority=np.array([r.priority for r in records], dtype=np.int64),
        intended_start_s=np.array([r.intended_start_s for r in records], dtype=np.float64),
        send_s=np.array([_nan(r.send_s) for r in records], dtype=np.float64),
        slot_s=np.array([_nan(r.slot_s) for r in records], dtype=np.float64),
        first_token_s=first,
        last_token_s=last,
        failed=np.array([r.error is not None for r in records], dtype=bool),
        cancelled=np.array([r.cancelled for r in records], dtype=bool),
        error_types={i: r.error_type for i, r in enumerate(records) if r.error is not None},
        max_tokens=np.array([NOT_ASKED if r.max_tokens is None else r.max_tokens
                             for r in records], dtype=np.int64),
        finish_stop=np.array([r.finish_reason == "stop" for r in records], dtype=bool),
        finish_length=np.array([r.finish_reason == "length" for r in records], dtype=bool),
        ttfot_s=np.array([_nan(r.ttfot_s) for r in records], dtype=np.float64),
        reasoning_tokens=np.array([_nan(r.reasoning_tokens) for r in records],
                                  dtype=np.float64),
        turn=np.array([NO_TURN if r.turn is None else r.turn for r in records], dtype=np.int64),
        tokens=RaggedTokens(per_token, per_event, event_k, event_t, slice_k),
        records=records,
    )


def token_gaps_s(rec: RequestRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-token gaps, per-event gaps, tokens per event) of one request, in seconds. An event
    of k tokens after a gap g gives k per-token gaps of g/k (SGLang's and inference-perf's
    definition); the first event's tokens have no gap before them."""
    times, k = rec.event_arrays()
    return (*_gaps_s(times, k), k)


def _gaps_s(times: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-token gaps, per-event gaps) of events at ``times`` of ``k`` tokens each."""
    if len(times) < 2:
        return np.zeros(0), np.zeros(0)
    gaps = np.diff(times)
    later = k[1:]
    nonzero = later > 0  # an event the count put at 0 tokens adds no per-token gap
    per_token = np.repeat(gaps[nonzero] / later[nonzero], later[nonzero].astype(np.int64))
    return per_token, gaps


def _flat(parts: list[np.ndarray], dtype) -> tuple[np.ndarray, np.ndarray]:
    """(the parts end to end, offsets: part i is flat[off[i]:off[i + 1]])."""
    off = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=off[1:])
    flat = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    return flat, off


def _gather(flat: np.ndarray, off: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The parts of ``rows``, end to end in row order (np.concatenate of them)."""
    lo = off[rows]
    lens = off[rows + 1] - lo
    total = int(lens.sum())
    if total == 0:
        return flat[:0]
    before = np.cumsum(lens) - lens
    return flat[np.repeat(lo - before, lens) + np.arange(total)]


class RaggedTokens:
    """Each request's token times, stream events and gaps, flat (the object path's form):
    every pooled array is the per-request arrays concatenated in row order, as the
    per-record code pooled them."""

    one_token_per_event = False  # an HTTP event may carry several

    def __init__(self, per_token_s, per_event_s, event_k, event_t, slice_k) -> None:
        self.per_token_s, self.g_off = _flat(per_token_s, np.float64)
        self.per_event_s, self.e_off = _flat(per_event_s, np.float64)
        self.event_k, self.k_off = _flat(event_k, np.float64)
        self.event_t, self.s_off = _flat(event_t, np.float64)
        self.slice_k, _ = _flat(slice_k, np.int64)

    def pooled_gaps_ms(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        return _gather(self.per_token_s, self.g_off, rows) * MS, None

    def event_gaps_ms(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        return _gather(self.per_event_s, self.e_off, rows) * MS, None

    def tokens_per_event(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        return _gather(self.event_k, self.k_off, rows), None

    def counted_events(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time, output tokens) of every stream event of ``rows``: the one rule both the
        slices and the steady-state window count tokens by. An event of k tokens counts k (an
        HTTP event may carry several: counting token_times_s entries counted events); what the
        events did not carry of the request's output_tokens counts at its last event."""
        return (_gather(self.event_t, self.s_off, rows),
                _gather(self.slice_k, self.s_off, rows))

    def tokens_between(self, rows: np.ndarray, a: float, b: float) -> int:
        times, k = self.counted_events(rows)
        return int(k[(times >= a) & (times <= b)].sum())

    def slice_tokens(self, rows: np.ndarray, bounds: np.ndarray, n: int) -> np.ndarray:
        tokens = np.zeros(n, dtype=np.int64)
        times, k = self.counted_events(rows)
        np.add.at(tokens, np.searchsorted(bounds, times, side="right"), k)
        return tokens
