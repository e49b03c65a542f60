"""Where a request's TTFT went: its time from the intended start to the first token the client
read, taken apart (summary.ttft_breakdown, per request ``ttft_parts``), and its E2EL likewise
(summary.e2el_breakdown, ``e2el_parts``).

TTFT = [slot_wait_ms] + send_lag_ms + network_in_ms + server_queue_ms + server_prefill_ms +
delivery_ms:

- ``slot_wait_ms`` (--max-concurrency only): intended start -> a slot freed;
- ``send_lag_ms``: ready -> the client sent it (the client's own lag);
- ``network_in_ms``: the send -> the engine's queue: the wire, HTTP and the server's front
  (parsing, tokenization, the wait for the engine's step in flight) on the way in;
- ``server_queue_ms``: queued (the scheduler took it in: vLLM's QUEUED event, the log's
  ``admitted``) -> first scheduled;
- ``server_prefill_ms``: first scheduled -> first token made;
- ``delivery_ms``: first token made -> the client read it (detokenize, the event's write, the
  wire back, the client's parse).

E2EL's parts are the same up to the prefill, then ``server_decode_ms`` (first -> last token
made) and ``delivery_ms`` of the last token.

The server's parts come from its response (vLLM's --enable-per-request-metrics ``metrics``:
queue_time_ms, time_to_first_token_ms, generation_time_ms; `cbbench serve` sends the same), or
from its request log joined by server_request_id (`cbbench serve --request-log`, given to `run
--server-log`). The two trips need the log on the client's clock (one host: the result's
summary.http.t0_epoch_s and the log share the epoch): the log's ``admitted`` (``submitted``
in a log without it) and ``first_token`` / ``last_token`` place them. Without the log they cannot be told apart, and
their sum is reported as ``network_ms`` (both trips and the server's front; the rest of the
TTFT once the measured parts are taken off).

Each request's ``residual_ms`` is its TTFT minus the sum of its parts. A request whose parts do
not add up within the clocks' uncertainty (``tolerance_ms``, 1 ms by default: |residual| or any
part below -tolerance) is flagged (``consistent: false``) with its figures as measured, never
adjusted, and left out of the summary's distributions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_log import LogLine, as_number, queued_at
from cbbench.analysis.summary.metrics import distribution
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES
from cbbench.schema.run import ServerTiming

MS = 1000.0
DEFAULT_TOLERANCE_MS = 1.0
TTFT_PARTS = ("slot_wait_ms", "send_lag_ms", "network_in_ms", "network_ms", "server_queue_ms",
              "server_prefill_ms", "delivery_ms")
E2EL_PARTS = ("slot_wait_ms", "send_lag_ms", "network_in_ms", "network_ms", "server_queue_ms",
              "server_prefill_ms", "server_decode_ms", "delivery_ms")
SOURCE_RESPONSE = "response"
SOURCE_LOG = "server_log"


@dataclass(frozen=True, slots=True)
class ServerParts:
    """The server's side of a request (ms), and where it came from (SOURCE_RESPONSE or
    SOURCE_LOG)."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float | None
    source: str


@dataclass(frozen=True, slots=True)
class Trips:
    """The way in and the deliveries of the first and last token (ms), from the log on the
    client's clock."""

    network_in_ms: float
    delivery_ms: float
    last_delivery_ms: float


def server_parts(rec: RequestRecord, line: LogLine | Mapping[str, Any] | None) -> ServerParts | None:
    """The server's queue, prefill and decode: the response's timings first, else the request
    log's; None without either."""
    # The server's timings as it sent them (a JSON object), read through the schema's names.
    t = ServerTiming.model_construct(**(rec.server_timing or {}))
    queue, prefill = as_number(t.queue_time_ms), as_number(t.time_to_first_token_ms)
    if queue is not None and prefill is not None:
        return ServerParts(queue, prefill, as_number(t.generation_time_ms), SOURCE_RESPONSE)
    log = None if line is None else LogLine.of(line)
    if log is None:
        return None
    sub, qx = queued_at(log), as_number(log.queue_exit)
    ft, lt = as_number(log.first_token), as_number(log.last_token)
    if sub is None or qx is None or ft is None:
        return None
    return ServerParts((qx - sub) * MS, (ft - qx) * MS,
                       (lt - ft) * MS if lt is not None else None, SOURCE_LOG)


def _client_parts(rec: RequestRecord, send_s: float) -> dict:
    out = {"send_lag_ms": (send_s - rec.ready_s) * MS}
    if rec.slot_s is not None:
        out["slot_wait_ms"] = (rec.slot_s - rec.intended_start_s) * MS
    return out


def _trips(rec: RequestRecord, send_s: float, line: LogLine | None,
           t0_epoch: float | None) -> Trips | None:
    """The way in and the two deliveries (first and last token), from the log on the client's
    clock; None without them."""
    if line is None or t0_epoch is None:
        return None
    sub, ft, lt = queued_at(line), as_number(line.first_token), as_number(line.last_token)
    if sub is None or ft is None or lt is None:
        return None
    return Trips(network_in_ms=(sub - (t0_epoch + send_s)) * MS,
                 delivery_ms=(t0_epoch + rec.token_times_s[0] - ft) * MS,
                 last_delivery_ms=(t0_epoch + rec.token_times_s[-1] - lt) * MS)


def _close(parts: dict, whole_ms: float, source: str, tol: float) -> dict:
    """The parts with their residual and verdict."""
    residual = whole_ms - sum(v for v in parts.values() if v is not None)
    if "network_ms" in parts:  # the rest once the measured parts are taken off: adds up by
        parts["network_ms"] += residual  # construction, so only its sign is a check
        residual = 0.0
    ok = abs(residual) <= tol and all(v is None or v >= -tol for v in parts.values())
    return {**parts, "source": source, "residual_ms": residual, "consistent": ok}


def request_parts(rec: RequestRecord, line: LogLine | Mapping[str, Any] | None,
                  t0_epoch: float | None,
                  tol: float = DEFAULT_TOLERANCE_MS) -> tuple[dict | None, dict | None]:
    """(ttft_parts, e2el_parts) of one completed request, or (None, None) when the server's
    side of it is unknown."""
    send, ttft_s, e2el_s = rec.send_s, rec.ttft_s, rec.e2el_s
    if send is None or ttft_s is None or e2el_s is None:  # not completed (rec.ok) or not sent
        return None, None
    log = None if line is None else LogLine.of(line)
    server = server_parts(rec, log)
    if server is None:
        return None, None
    source = server.source
    trips = _trips(rec, send, log, t0_epoch)
    if trips is not None and source == SOURCE_RESPONSE:
        source = f"{SOURCE_RESPONSE}+{SOURCE_LOG}"
    client = _client_parts(rec, send)
    head = {**client, **({"network_in_ms": trips.network_in_ms} if trips else
                         {"network_ms": 0.0})}
    ttft = _close({**head, "server_queue_ms": server.queue_ms,
                   "server_prefill_ms": server.prefill_ms,
                   **({"delivery_ms": trips.delivery_ms} if trips else {})},
                  ttft_s * MS, source, tol)
    e2el = None
    if server.decode_ms is not None:
        e2el = _close({**head, "server_queue_ms": server.queue_ms,
                       "server_prefill_ms": server.prefill_ms,
                       "server_decode_ms": server.decode_ms,
                       **({"delivery_ms": trips.last_delivery_ms} if trips else {})},
                      e2el_s * MS, source, tol)
    return ttft, e2el


def attach_parts(records: Sequence[RequestRecord],
                 log: Mapping[str, LogLine | Mapping[str, Any]] | None,
                 t0_epoch: float | None, tol: float = DEFAULT_TOLERANCE_MS) -> int:
    """Set ttft_parts / e2el_parts on every completed request the server told about; the
    number that got them."""
    n = 0
    for r in records:
        line = log.get(r.server_request_id) if log and r.server_request_id else None
        r.ttft_parts, r.e2el_parts = request_parts(r, line, t0_epoch, tol)
        n += r.ttft_parts is not None
    return n


def breakdown(records: Sequence[RequestRecord], attr: str, whole: str, names: Sequence[str],
              tol: float = DEFAULT_TOLERANCE_MS, percentiles=DEFAULT_PERCENTILES) -> dict | None:
    """summary.ttft_breakdown (attr 'ttft_parts', whole 'ttft_s') or e2el_breakdown: each
    part's distribution over the consistent requests, with its share of the whole (the part's
    sum over the whole's), and how many requests were split and flagged."""
    split = [r for r in records if getattr(r, attr) is not None]
    if not split:
        return None
    good = [r for r in split if getattr(r, attr)["consistent"]]
    total = sum(getattr(r, whole) for r in good) * MS
    out: dict = {
        "requests": len(split),
        "flagged": len(split) - len(good),
        "tolerance_ms": tol,
        "sources": sorted({getattr(r, attr)["source"] for r in split}),
    }
    for name in names:
        vals = [getattr(r, attr)[name] for r in good if getattr(r, attr).get(name) is not None]
        if not vals:
            continue
        d = distribution(vals, percentiles)
        d["share"] = sum(vals) / total if total > 0 else None
        out[name] = d
    out["residual_ms"] = distribution([getattr(r, attr)["residual_ms"] for r in split],
                                      percentiles)
    return out


def summarize_breakdown(records: Sequence[RequestRecord], tol: float = DEFAULT_TOLERANCE_MS,
                        percentiles=DEFAULT_PERCENTILES) -> dict:
    """The summary's ttft_breakdown and e2el_breakdown (absent when no request was split)."""
    out = {}
    t = breakdown(records, "ttft_parts", "ttft_s", TTFT_PARTS, tol, percentiles)
    if t is not None:
        out["ttft_breakdown"] = t
    e = breakdown(records, "e2el_parts", "e2el_s", E2EL_PARTS, tol, percentiles)
    if e is not None:
        out["e2el_breakdown"] = e
    return out
