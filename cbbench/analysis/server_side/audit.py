"""`cbbench audit`: a client's per-request figures held to the server's own record of the same
requests (`cbbench serve --request-log`), joined by the response id (server_request_id), or,
for a tool that recorded none (an import), by send order: the result's sent requests in send
order to the log's lines in arrival order, when the two counts agree.

The server logs, per request, when it read the request (``arrival``) and when it wrote each
stream event, with its token count and kind (reasoning, answer, tool). Those are the truth:
the client's TTFT should be the server's first write after its arrival, give or take the two
trips over the wire (request in, event out), and every token count should be the server's
exactly. Per metric the audit reports the client's error against that truth over the joined
requests (median, p99, max of client - server, in ms) and passes when:

- timings: the median per-request error's size (TTFT, TTFOT, E2EL, TPOT, each event gap)
  and, for per-token ITL and TPOT, the difference of the two sides' p50s are within the
  tolerance (default 2 ms); with ``tail_tolerance_ms``
  the p99 error's size too;
- counts (output, reasoning and tool-call tokens, events, tokens of each event, cached
  tokens): equal on every joined request.

The server's own timings, where the result recorded them from its responses (vLLM's
per-request ``metrics``: queue, prefill, decode; cbbench run, or an imported vLLM bench file),
are held to the log's too (``server_queue_ms`` ...: recorded - logged), shown, not gated.

Client times are from its send (``send_s``), not the intended start: the audit checks the
measurement, not the schedule. On one host (the result's ``summary.http.t0_epoch_s`` and the log
share the epoch, both moved from the monotonic clock) the truth counts from the client's send
too, so an error is exactly how late the client saw what the server wrote; the request's way in
(send -> the server's arrival) is reported apart, as ``request_transit_ms``. The result must
carry per-event times (``--save-detailed``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from cbbench.analysis.server_log import (
    DEFAULT_TOLERANCE_MS,
    MAX_TOKENS,
    LogLine,
    as_number,
    is_count,
    queued_at,
    read_server_log,
)
from cbbench.errors import UsageError
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Request, RunResult, ServerTiming

__all__ = ["DEFAULT_TOLERANCE_MS", "audit", "read_server_log"]

MS = 1000.0
TIMING_METRICS = ("ttft_ms", "ttfot_ms", "e2el_ms", "tpot_ms", "event_gap_ms")
# The distributions' p50s held to the tolerance: per-token ITL and TPOT (pooled over many
# tokens). TTFT's and TTFOT's p50s are shown, not held: over a few dozen requests the p50 moves
# with which request sits in the middle, and their per-request error is held instead.
GATED_P50 = ("itl_p50_ms", "tpot_p50_ms")
COUNT_METRICS = (
    "output_tokens", "reasoning_tokens", "tool_call_tokens", "events", "tokens_per_event",
    "cached_tokens",
)
# The server's own timings as the client recorded them from its responses (vLLM's
# --enable-per-request-metrics `metrics`: cbbench run, or an imported vLLM bench file) held to
# the log's, which come from the same engine timestamps: shown, not gated (they hold the
# server to itself, not the client to the server).
SERVER_TIMING_METRICS: dict[str, Callable[[ServerTiming], float | None]] = {
    "server_queue_ms": lambda t: t.queue_time_ms,
    "server_prefill_ms": lambda t: t.time_to_first_token_ms,
    "server_decode_ms": lambda t: t.generation_time_ms,
}


@dataclass(frozen=True, slots=True)
class Counts:
    """One request's counts as one side has them (COUNT_METRICS but tokens_per_event, which
    compares the event lists; None: the side does not know it)."""

    output_tokens: int | None
    reasoning_tokens: int | None
    tool_call_tokens: int | None
    events: int | None
    cached_tokens: int | None


@dataclass(frozen=True, slots=True)
class ServerMs:
    """The server's queue, prefill and decode (ms; SERVER_TIMING_METRICS) as one side has
    them: the response's, or the log's."""

    server_queue_ms: float | None = None
    server_prefill_ms: float | None = None
    server_decode_ms: float | None = None


@dataclass(slots=True)
class Side:
    """One request's figures from one side: event times and tokens (epoch seconds), the first
    output event's time, and the origin its latencies count from."""

    origin: float
    times: list[float]
    tokens: list[int]
    first_output: float | None
    n: int
    counts: Counts
    server_ms: ServerMs = field(default_factory=ServerMs)

    @property
    def ttft(self) -> float:
        return self.times[0] - self.origin

    @property
    def ttfot(self) -> float | None:
        return self.first_output - self.origin if self.first_output is not None else None

    @property
    def e2el(self) -> float:
        return self.times[-1] - self.origin

    @property
    def tpot(self) -> float | None:
        return (self.times[-1] - self.times[0]) / (self.n - 1) if self.n > 1 else None


def _per_token(times: Sequence[float], tokens: Sequence[int]) -> np.ndarray:
    if len(times) < 2:
        return np.zeros(0)
    g = np.diff(np.asarray(times, dtype=np.float64))
    k = np.asarray(tokens[1:], dtype=np.int64)
    keep = k > 0
    return np.repeat(g[keep] / k[keep], k[keep])


def client_side(r: Request, t0_epoch: float) -> Side | None:
    """A completed request of a result (detailed; run-clock times moved to the epoch by
    ``t0_epoch``), or None when it did not complete."""
    t = r.token_times_s
    if r.error is not None or r.cancelled or not t:
        return None
    send = r.send_s
    if send is None:
        raise UsageError("the result's requests carry no send_s: rerun with --save-detailed "
                         "(and this cbbench)")
    if (problem := _request_problem(r)) is not None:
        raise UsageError(f"the result's request {r.id!r}: {problem}, not as cbbench writes "
                         "it: the audit cannot read what the client counted")
    n = r.output_tokens or 0
    first_out = r.first_output_s
    calls = r.tool_calls
    timing = r.server_timing
    return Side(
        origin=t0_epoch + send,
        times=[t0_epoch + x for x in t],
        tokens=list(r.event_tokens or [1] * len(t)),
        first_output=t0_epoch + first_out if first_out is not None else None,
        n=n,
        counts=Counts(
            output_tokens=n,
            reasoning_tokens=r.reasoning_tokens,
            tool_call_tokens=sum(_argument_tokens(c) for c in calls) if calls else 0,
            events=len(t),
            cached_tokens=r.cached_tokens,
        ),
        server_ms=ServerMs(**{name: as_number(value(timing)) if timing is not None else None
                              for name, value in SERVER_TIMING_METRICS.items()}),
    )


def _request_problem(r: Request) -> str | None:
    """What makes a completed request's audited fields unreadable, or None. The stream reader
    writes one event_tokens entry per token_times_s entry, each a count, and each tool call's
    argument_tokens as a count (targets/tool_calls.py); the schema holds only their types.
    A file that breaks this is refused, not audited without the request: the audit cannot
    say what the client counted, and a request left out fails the coverage anyway, under a
    wrong reason. Was: a TypeError (argument_tokens "many"), an IndexError (event_tokens
    shorter than token_times_s), an OverflowError (a 10^30-token event) as tracebacks."""
    times, tokens = r.token_times_s or [], r.event_tokens
    if tokens is not None:
        if len(tokens) != len(times):
            return (f"event_tokens has {len(tokens)} entries for its {len(times)} "
                    "token_times_s")
        if not all(is_count(k) for k in tokens):
            return f"event_tokens must be counts in [0, {MAX_TOKENS}]"
    for i, call in enumerate(r.tool_calls or []):
        match call:
            case {"argument_tokens": n} if not is_count(n):
                return (f"tool_calls[{i}].argument_tokens must be a count in [0, "
                        f"{MAX_TOKENS}], got {n!r:.40}")
    return None


def _argument_tokens(call: Mapping[str, Any]) -> int:
    """A tool call's argument tokens as the stream reader wrote it (targets/tool_calls.py:
    {"id", "name", "argument_tokens"}; a count, _request_problem); 0 where it has none."""
    match call:
        case {"argument_tokens": int(n)}:
            return n
    return 0


@dataclass(frozen=True, slots=True)
class ClientHealth:
    """What the audit reads of summary.http, the client's health (targets/client_health.py),
    an extra field of the summary model: its values as the result holds them (None: absent)."""

    t0_epoch_s: Any = None  # the run clock's zero on the epoch: a float on one host
    loop_lag_p50_ms: Any = None
    loop_lag_p99_ms: Any = None
    send_lag_p50_ms: Any = None
    send_lag_p99_ms: Any = None
    client_bound: Any = None
    client_fell_behind: Any = None


def _http(run: RunResult) -> ClientHealth:
    extra = run.summary.model_extra or {}
    match extra:
        case {"http": dict(http)}:
            return ClientHealth(**{f.name: http.get(f.name) for f in fields(ClientHealth)})
    return ClientHealth()


def _log_server_ms(line: LogLine) -> ServerMs:
    """The log's queue (admitted -> queue_exit), prefill (-> first_token) and decode (->
    last_token), in ms, as request_metrics.py forms the response's."""
    sub = queued_at(line)
    qx, ft, lt = (as_number(v) for v in (line.queue_exit, line.first_token, line.last_token))

    def gap(a, b):
        return (b - a) * MS if a is not None and b is not None else None

    return ServerMs(server_queue_ms=gap(sub, qx), server_prefill_ms=gap(qx, ft),
                    server_decode_ms=gap(ft, lt))


def server_side(line: LogLine | Mapping[str, Any]) -> Side | None:
    """A request-log line of a streamed request that finished, or None. Its origin is the
    server's arrival (the audit moves it to the client's send on a shared clock)."""
    line = LogLine.of(line)
    events = line.events
    if not events or line.status != 200 or line.finish in (None, "abort", "error"):
        return None
    if line.arrival is None:
        raise KeyError("arrival")  # a line with events has one (server_log.line_problem)
    tokens = [e[1] for e in events]
    n = line.output_tokens or sum(tokens)
    return Side(
        origin=line.arrival,
        times=[e[0] for e in events],
        tokens=tokens,
        first_output=line.first_output_sent,
        n=n,
        counts=Counts(
            output_tokens=n,
            reasoning_tokens=line.reasoning_tokens,
            tool_call_tokens=line.tool_call_tokens or 0,
            events=len(events),
            cached_tokens=line.cached_tokens,
        ),
        server_ms=_log_server_ms(line),
    )


# -- the report's figures: typed here, written as the report's dicts (their fields in order) --


@dataclass(slots=True)
class Errors:
    """Client - server errors (ms) over the joined requests: the median, the p99 of their
    size, the largest by size (its sign kept), how many."""

    median: float | None
    p99: float | None
    max: float | None
    count: int


@dataclass(slots=True)
class TimingVerdict(Errors):
    passed: bool


@dataclass(slots=True)
class ShownErrors(Errors):
    """SERVER_TIMING_METRICS' errors: shown, never gated."""

    gated: bool = False
    passed: bool = True


@dataclass(slots=True)
class P50Verdict:
    """A run-wide p50 as each side computes it, and their difference (ms)."""

    client: float | None
    server: float | None
    error: float | None
    gated: bool
    passed: bool


@dataclass(slots=True)
class CountVerdict:
    requests: int
    mismatched: int
    max_abs_diff: int
    passed: bool


@dataclass(slots=True)
class EventTokensVerdict:
    """tokens_per_event: each request's tokens per event, compared event by event."""

    requests: int
    mismatched: int
    server_mean: float
    passed: bool


@dataclass(slots=True)
class Coverage:
    completed: int
    joined: int
    missing: int
    passed: bool


Verdict = TimingVerdict | ShownErrors | P50Verdict | CountVerdict | EventTokensVerdict


def _errors(values: Sequence[float]) -> Errors:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return Errors(median=None, p99=None, max=None, count=0)
    big = a[np.argmax(np.abs(a))]
    return Errors(median=float(np.median(a)), p99=float(np.percentile(np.abs(a), 99)),
                  max=float(big), count=int(a.size))


def _join(requests: Sequence[Request], log: Mapping[str, LogLine], t0_epoch: float | None,
          by_order: bool) -> tuple[list[tuple[Side, Side]], list[float], tuple[int, int, int]]:
    """The (client, server) pairs of the completed requests, the request transits (ms, on a
    shared clock: ``t0_epoch`` given) and the counts of those without an id, not in the log,
    and in it but not a finished stream."""
    pairs: list[tuple[Side, Side]] = []
    transit: list[float] = []
    no_id = unmatched = not_comparable = 0
    find = _id_lookup(log)
    for r, line in (_by_send_order(requests, log) if by_order else
                    ((r, find(r.server_request_id)) for r in requests)):
        c = client_side(r, t0_epoch if t0_epoch is not None else 0.0)
        if c is None:
            continue
        rid = r.server_request_id if not by_order else "by-order"
        if rid is None:
            no_id += 1
            continue
        if line is None:
            unmatched += 1
            continue
        s = server_side(line)
        if s is None:
            not_comparable += 1
            continue
        if t0_epoch is not None:  # the truth counts from the client's send, as the client does
            transit.append((s.origin - c.origin) * MS)
            s.origin = c.origin
        pairs.append((c, s))
    return pairs, transit, (no_id, unmatched, not_comparable)


def audit(result: RunResult | Mapping[str, Any], log: Mapping[str, LogLine | Mapping[str, Any]],
          tolerance_ms: float = DEFAULT_TOLERANCE_MS,
          tail_tolerance_ms: float | None = None) -> dict:
    """The audit report (see the module doc), passed or not. ``log``: the request
    log's lines by id (read_server_log's dicts, or typed lines)."""
    run = as_run(result)
    lines = {rid: LogLine.of(line) for rid, line in log.items()}
    # The run clock's zero on the epoch (client_health.py), as the log's times are.
    t0_epoch = _http(run).t0_epoch_s
    shared_clock = isinstance(t0_epoch, float)
    requests = run.requests or []
    if requests and not any(r.token_times_s for r in requests):
        raise UsageError("the result's requests carry no token times: rerun cbbench run with "
                         "--save-detailed")
    by_order = bool(requests) and all(r.server_request_id is None for r in requests)
    pairs, transit, (no_id, unmatched, not_comparable) = _join(
        requests, lines, t0_epoch if shared_clock else None, by_order)
    if not pairs:
        raise UsageError("no request of the result joins a streamed request of the server log "
                         f"(by server_request_id; {no_id} without an id, {unmatched} not in "
                         "the log): is it this run's log?")
    if shared_clock:
        _check_same_clock(transit)
    metrics: dict[str, Verdict] = {}
    for name in TIMING_METRICS:
        if name == "event_gap_ms":
            errs = [
                (cg - sg) * MS for c, s in pairs if len(c.times) == len(s.times)
                for cg, sg in zip(np.diff(c.times), np.diff(s.times))
            ]
        else:
            attr = name[:-3]
            errs = [
                (getattr(c, attr) - getattr(s, attr)) * MS for c, s in pairs
                if getattr(c, attr) is not None and getattr(s, attr) is not None
            ]
        e = _errors(errs)
        ok = e.median is None or abs(e.median) <= tolerance_ms
        if tail_tolerance_ms is not None and e.p99 is not None:
            ok = ok and e.p99 <= tail_tolerance_ms
        metrics[name] = TimingVerdict(**asdict(e), passed=ok)
    figures = _p50_figures(pairs)
    for name, (cv, sv) in figures.items():
        d = None if cv is None or sv is None else cv - sv
        gated = name in GATED_P50
        metrics[name] = P50Verdict(client=cv, server=sv, error=d, gated=gated,
                                   passed=not gated or d is None or abs(d) <= tolerance_ms)
    metrics.update(_server_timing_errors(pairs))
    for name in COUNT_METRICS:
        if name == "tokens_per_event":
            wrong = sum(c.tokens != s.tokens for c, s in pairs)
            tokens = sum(sum(s.tokens) for _, s in pairs)
            events = sum(len(s.tokens) for _, s in pairs)
            metrics[name] = EventTokensVerdict(requests=len(pairs), mismatched=wrong,
                                               server_mean=tokens / max(1, events),
                                               passed=wrong == 0)
            continue
        both = [(getattr(c.counts, name), b) for c, s in pairs
                if (b := getattr(s.counts, name)) is not None]
        diffs = [(a if a is not None else 0) - b for a, b in both]
        wrong = sum(d != 0 for d in diffs)
        metrics[name] = CountVerdict(requests=len(both), mismatched=wrong,
                                     max_abs_diff=max((abs(d) for d in diffs), default=0),
                                     passed=wrong == 0)
    missing = no_id + unmatched + not_comparable
    # A verdict on the requests the log holds says nothing of those it lacks: 15 of 30
    # requests absent passed. Every completed request must be joined for a pass.
    coverage = Coverage(completed=len(pairs) + missing, joined=len(pairs), missing=missing,
                        passed=missing == 0)
    passed = all(m.passed for m in metrics.values()) and coverage.passed
    return {
        "joined": len(pairs),
        # send_order: the tool recorded no response ids (an import): its requests in send
        # order joined to the log's lines in arrival order, one for one.
        "joined_by": "send_order" if by_order else "server_request_id",
        "without_id": no_id,
        "not_in_log": unmatched,
        "not_comparable": not_comparable,
        # shared_clock: the server's event times are compared with the client's reads on
        # one clock (same host), latencies from the client's send on both sides; else each
        # side counts from its own start (client send, server arrival), and TTFT's error
        # includes the request's way in.
        "basis": "shared_clock" if shared_clock else "own_origins",
        "request_transit_ms": asdict(_errors(transit)),  # send -> the server's arrival
        "tolerance_ms": tolerance_ms,
        "tail_tolerance_ms": tail_tolerance_ms,
        "metrics": {name: asdict(m) for name, m in metrics.items()},
        "coverage": asdict(coverage),
        "cause": None if passed else failure_cause(run, metrics, coverage, transit,
                                                   tolerance_ms),
        "passed": passed,
    }


# On one host the request's way in (client send -> server arrival) is loopback: well under a
# millisecond. A median beyond this is not that: the log's clock is not the result's (another
# host, or another run's log whose ids happen to match).
MAX_SAME_HOST_TRANSIT_S = 60.0


def _check_same_clock(transit_ms: list[float]) -> None:
    med = float(np.median(transit_ms)) / MS
    if abs(med) > MAX_SAME_HOST_TRANSIT_S:
        raise UsageError(f"the server log's arrivals are {med:+.3g} s from the client's sends "
                         "(median): not this run's log, or not on this run's clock")


def failure_cause(result: RunResult, metrics: Mapping[str, Verdict], coverage: Coverage,
                  transit_ms: list[float], tolerance_ms: float) -> str:
    """Why the audit failed, in a line: missing data, the client (its own record of its event
    loop's lag and its send lag, against the failing errors), or neither. A client too loaded
    to read its streams on time sees every event late: the error is the client's, and
    FAILED alone read as a server bug (issue 35)."""
    if not coverage.passed:
        return (f"{coverage.missing} of {coverage.completed} completed requests are not "
                "in the log as finished streams: the verdict needs every one (is it this "
                "run's whole log?)")
    timing = [n for n, m in metrics.items() if not m.passed and n.endswith("_ms")]
    if not timing:
        return "a token count differs from the server's: the client miscounted"
    worst = max(_error_size(metrics[n]) for n in timing)
    http = _http(result)
    way_in = float(np.median(transit_ms)) if transit_ms else None
    evidence = []
    loop_p99 = http.loop_lag_p99_ms
    if isinstance(loop_p99, (int, float)) and (loop_p99 >= worst or http.client_bound):
        evidence.append(f"its event loop woke late (p50 {http.loop_lag_p50_ms:.1f} ms, p99 "
                        f"{loop_p99:.1f} ms)")
    send_p99 = http.send_lag_p99_ms
    if http.client_fell_behind and isinstance(send_p99, (int, float)):
        evidence.append(f"it fell behind its sends (send lag p50 {http.send_lag_p50_ms:.1f} ms, "
                        f"p99 {send_p99:.1f} ms)")
    if way_in is not None and way_in > tolerance_ms:
        evidence.append(f"its requests reached the server {way_in:.1f} ms after it stamped "
                        "them sent (median)")
    if evidence:
        return (f"the client, not the server: {'; '.join(evidence)}, against errors of up to "
                f"{worst:.1f} ms in {', '.join(timing)}; the server's log holds the true "
                "times. Rerun the client on a less loaded machine, or with --workers N")
    return (f"{', '.join(timing)} off by up to {worst:.1f} ms, and the client recorded no lag "
            "that explains it: its reads of the streams were late (the server log holds the "
            "true times)")


def _error_size(m: Verdict) -> float:
    """How far off a failing timing is (ms): its median error, or its p50s' difference."""
    median = m.median if isinstance(m, Errors) else None
    if median is not None:
        return abs(median)
    return abs((m.error if isinstance(m, P50Verdict) else None) or 0.0)


def _server_timing_errors(pairs: list[tuple[Side, Side]]) -> dict[str, ShownErrors]:
    """SERVER_TIMING_METRICS' errors (recorded - logged, ms), shown; none when the result
    recorded no server timings."""
    out: dict[str, ShownErrors] = {}
    for name in SERVER_TIMING_METRICS:
        errs = [cv - sv for c, s in pairs
                if (cv := getattr(c.server_ms, name)) is not None
                and (sv := getattr(s.server_ms, name)) is not None]
        if errs:
            out[name] = ShownErrors(**asdict(_errors(errs)))
    return out


def _id_lookup(log: Mapping[str, LogLine]):
    """The log line of a request id: the response id itself, or the id a client chose and
    sent as X-Request-Id (AIPerf's x_request_id), which the server made the tail of its
    response id (``chatcmpl-<id>``, as vLLM forms it)."""
    tails = {k.split("-", 1)[1]: v for k, v in log.items() if "-" in k}

    def find(rid):
        if rid is None:
            return None
        return log.get(rid) or tails.get(rid)

    return find


def _by_send_order(requests: Sequence[Request], log: Mapping[str, LogLine]):
    """(request, log line) pairs: the sent requests by their send, the log's lines by their
    arrival. Only a log of exactly this run's requests joins so: the counts must agree."""
    sent = [r for _, r in sorted(((r.send_s, r) for r in requests if r.send_s is not None),
                                 key=lambda sr: sr[0])]
    lines = sorted(log.values(), key=lambda x: x.arrival or 0.0)
    if len(sent) != len(lines):
        raise UsageError(f"the result records no response ids, and its {len(sent)} sent requests "
                         f"cannot be joined by send order to the log's {len(lines)} lines: give "
                         "the log of this run alone")
    return list(zip(sent, lines))


def _p50_figures(pairs: list[tuple[Side, Side]]) -> dict[str, tuple[float | None, float | None]]:
    """The run's p50s as each side computes them (ms): per-token ITL, TPOT, TTFT, TTFOT."""

    def p50(values) -> float | None:
        a = np.asarray(values, dtype=np.float64)
        return float(np.percentile(a, 50)) * MS if a.size else None

    out: dict[str, list[float | None]] = {}
    for side in (0, 1):
        sides = [p[side] for p in pairs]
        itl = [_per_token(x.times, x.tokens) for x in sides]
        vals = {
            "itl_p50_ms": p50(np.concatenate(itl) if itl else []),
            "tpot_p50_ms": p50([x.tpot for x in sides if x.tpot is not None]),
            "ttft_p50_ms": p50([x.ttft for x in sides]),
            "ttfot_p50_ms": p50([x.ttfot for x in sides if x.ttfot is not None]),
        }
        for k, v in vals.items():
            out.setdefault(k, [None, None])[side] = v
    return {k: (v[0], v[1]) for k, v in out.items()}
