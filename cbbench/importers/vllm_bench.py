"""vLLM bench (`vllm bench serve --save-result --save-detailed`) -> a cbbench result.

vLLM's result JSON keeps, with --save-detailed, one list entry per request in send order:
``input_lens`` (the server's usage prompt_tokens when it sent usage), ``output_lens``,
``ttfts`` (s), ``itls`` (s, one gap per streamed chunk), ``latencies`` (s), ``start_times``
(time.perf_counter at the send, s), ``queue_times`` (s: the send minus when the schedule
released the request, i.e. the client's own lag and, with --max-concurrency, the wait for a
slot), ``errors`` ("" when the request succeeded), and, when the server returned per-request
metrics (vLLM's --enable-per-request-metrics, `cbbench serve` likewise), ``server_queue_times``
and ``server_ttfts`` (s); the run's ``duration`` (s), ``date`` (local time when the run
ended, %Y%m%d-%H%M%S), ``model_id``, ``request_rate`` and ``max_concurrency`` beside them
(vllm/benchmarks/serve.py, vLLM 0.33; checked on a real run against `cbbench serve`).

What carries over, and how it differs from a cbbench run of the same load:
- the intended start is when vLLM's schedule released the request (the send minus its
  ``queue_times``), so the send lag is vLLM's client queue time; vLLM times its own TTFT and
  E2EL from the send, which the audit uses too (without ``queue_times``: intended = send).
  With ``max_concurrency`` that queue time is the wait for vLLM's semaphore, so it is a slot
  wait: the slot freed at the send (vLLM's clock starts inside the semaphore), and the
  summary holds ``slot_wait_ms``, ``latency_basis`` and ``from_send`` (TTFT and E2EL from the
  send: vLLM's own figures) as a cbbench --max-concurrency run does;
- vLLM's ``itls`` are one gap per chunk, and vLLM records no tokens per chunk; a chunk is a
  delta with ``content``, ``reasoning`` (vLLM's own field name), tool calls, or an empty
  content: a server that streams reasoning in another field (``reasoning_content``) has its
  reasoning chunks skipped by vLLM bench, so its TTFT is the first answer chunk;
- a request's events are its chunks (first token, then each gap), with vLLM's output length as
  the token count, so TPOT is (E2EL - TTFT) / (output - 1) as in vLLM. cbbench's ITL is per
  token (a chunk of k tokens after a gap g is k gaps of g / k), so each chunk's tokens are
  found as for AIPerf (fields.chunk_tokens): exact where the counts fix them (as many chunks
  as tokens, or one chunk), else spread over the chunks (the first one token, the rest
  evenly; method ``spread``). ``event_gap_ms`` is vLLM's own per-chunk ITL; ``itl_ms`` the
  per-token one, whose mean is exact (the chunk gaps' sum over the tokens after the first);
- vLLM records no reasoning token count and no response id: `cbbench audit` joins it to a
  server log by send order;
- a failed request's ``errors`` entry is the HTTP reason phrase, or the client's whole
  traceback: kept as its last line, typed as cbbench types a failure (http_status, connect,
  timeout, stream_cut, ...); "" with no first token and no output is a failure too;
- its times are perf_counter readings, a clock of the host it ran on. ``origin`` puts them on
  the Unix clock when the file was written on this host since its last boot (`cbbench import
  --same-host`), so the audit compares them with the server log's on one clock.
The summary is then cbbench's own (the same functions as a run), so compare and gate treat an
imported file like any other.
"""

from __future__ import annotations

import datetime as dt
import http
import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from cbbench.analysis.records import RequestRecord
from cbbench.clock_offset import perf_minus_epoch
from cbbench.errors import UsageError
from cbbench.finite import is_finite
from cbbench.importers.fields import base_config, chunk_tokens, count, number, positive

TOOL = "vllm-bench"
PER_REQUEST_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")
DATE_FORMAT = "%Y%m%d-%H%M%S"
MS = 1000.0
# --same-host: the file's date (the run's end, to the second, on the local clock) must fall
# this close to its perf_counter times put on this host's Unix clock. Below: the date is
# truncated to the second; above: vLLM stamps it after its summary, a moment after the end.
DATE_EARLY_S, DATE_LATE_S = 2.0, 60.0
# vLLM's `errors` entry: a non-200 answer's HTTP reason phrase ("Bad Request"), else the whole
# traceback of what its client raised. Its last line names the exception, which gives
# cbbench's error type (targets/transport.py ERROR_TYPES); the first marker found wins.
HTTP_REASONS = frozenset(s.phrase for s in http.HTTPStatus)
EXCEPTION_TYPES = (
    ("TimeoutError", "timeout"),
    ("ClientConnectorDNSError", "dns"),
    ("ClientConnectorError", "connect"),
    ("ServerDisconnectedError", "stream_cut"),
    ("ClientPayloadError", "stream_cut"),
    ("Never received a valid chunk", "bad_event"),
)
NO_REASON = "failed (vLLM bench recorded no reason)"


class VllmBenchFile(BaseModel):
    """The fields of vLLM bench's result this importer reads (vllm/benchmarks/serve.py), as
    written: each is checked where it is read, with the message that names it."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())  # model_id is vLLM's

    input_lens: Any = None
    output_lens: Any = None
    ttfts: Any = None
    itls: Any = None
    latencies: Any = None
    start_times: Any = None
    queue_times: Any = None
    errors: Any = None
    server_queue_times: Any = None
    server_ttfts: Any = None
    duration: Any = None
    date: Any = None
    label: Any = None
    dataset_name: Any = None
    request_rate: Any = None
    base_url: Any = None
    backend: Any = None
    model_id: Any = None
    max_concurrency: Any = None
    burstiness: Any = None


def _file(data: Mapping | VllmBenchFile) -> VllmBenchFile:
    return data if isinstance(data, VllmBenchFile) else VllmBenchFile.model_validate(dict(data))


def records(raw: Mapping | VllmBenchFile, source: str) -> list[RequestRecord]:
    data = _file(raw)
    lists = {"input_lens": data.input_lens, "output_lens": data.output_lens, "ttfts": data.ttfts,
             "itls": data.itls, "start_times": data.start_times, "errors": data.errors}
    missing = [k for k in PER_REQUEST_KEYS if not isinstance(lists[k], list)]
    if missing:
        raise UsageError(
            f"{source} has no per-request {', '.join(missing)}: run vllm bench serve with "
            "--save-result --save-detailed"
        )
    n = len(data.ttfts)
    if any(len(lists[k]) != n for k in PER_REQUEST_KEYS):
        raise UsageError(f"{source}: its per-request lists have different lengths")
    if n == 0:  # imported, exit 0, as a result of 0 requests that gate and compare then read
        raise UsageError(f"{source} holds no requests: its per-request lists are empty")
    latencies = data.latencies
    starts = [_clock_reading(s, source, "start_times") for s in data.start_times]
    queued = _optional_list(data.queue_times, "queue_times", n, source)
    server_queue = _optional_list(data.server_queue_times, "server_queue_times", n, source)
    server_ttft = _optional_list(data.server_ttfts, "server_ttfts", n, source)
    t0 = _zero(data, source)
    capped = _cap(data.max_concurrency)
    out = []
    for i in range(n):
        start = starts[i] - t0
        queue = queued[i]
        rec = RequestRecord(
            id=i,
            prompt_tokens=count(data.input_lens[i], source, "input_lens"),
            output_tokens=count(data.output_lens[i], source, "output_lens"),
            intended_start_s=start - queue if queue is not None else start,
            send_s=start,
        )
        if capped:
            # --max-concurrency: vLLM's queue time is the wait for its semaphore, a slot wait,
            # and its clock starts once it holds one (a request's send): the slot freed then.
            rec.slot_s = start
        rec.server_timing = _server_timing(server_queue[i], server_ttft[i])
        # Counted by the tool (its tokenizer or the server's usage): recorded as its count.
        rec.output_tokens_method = TOOL
        rec.output_token_counts = {TOOL: rec.output_tokens}
        error = data.errors[i]
        if not error and _looks_failed(data, i):
            error = NO_REASON
        if error:
            rec.error, rec.error_type = _error(str(error))
        else:
            rec.token_times_s, chunked = _token_times(data, i, start, latencies, source)
            if chunked and (split := chunk_tokens(len(rec.token_times_s), rec.output_tokens)):
                rec.event_tokens, rec.event_tokens_method = split
        out.append(rec)
    return out


def _cap(v: Any) -> bool:
    """vLLM ran with --max-concurrency (an integer >= 1; null without it)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _looks_failed(data: VllmBenchFile, i: int) -> bool:
    """vLLM writes a non-200 answer's reason phrase as the error, which is "" when the server
    sent none: such a request has no first token (TTFT exactly 0) and no output."""
    return data.ttfts[i] == 0 and data.output_lens[i] == 0 and not data.itls[i]


def _error(text: str) -> tuple[str, str]:
    """(message, error type) of vLLM's error entry: a traceback is kept as its last line."""
    lines = [x for x in text.strip().splitlines() if x.strip()]
    message = lines[-1].strip() if lines else text
    if message in HTTP_REASONS:
        return f"HTTP {message}", "http_status"
    for marker, kind in EXCEPTION_TYPES:
        if marker in message:
            return message, kind
    return message, "error"


def _zero(data: VllmBenchFile, source: str) -> float:
    """The run's zero on vLLM's perf_counter: the first release by its schedule (or send)."""
    starts = [_clock_reading(s, source, "start_times") for s in data.start_times]
    queued = _optional_list(data.queue_times, "queue_times", len(starts), source)
    firsts = [s - (q or 0.0) for s, q in zip(starts, queued)]
    return min(firsts) if firsts else 0.0


def _optional_list(v: object, key: str, n: int, source: str) -> list[float | None]:
    """A per-request list of times (s) vLLM writes only sometimes (None entries kept): ``v``,
    the file's ``key``."""
    if v is None:
        return [None] * n
    if not isinstance(v, list) or len(v) != n:
        raise UsageError(f"{source}: {key} is not a list of one entry per request")
    return [None if x is None else _number(x, source, key) for x in v]


def _server_timing(queue: float | None, prefill: float | None) -> dict | None:
    """The server's per-request metrics vLLM kept (s), as the `metrics` object's fields (ms):
    vLLM keeps only these two of them."""
    if queue is None and prefill is None:
        return None
    return {"queue_time_ms": None if queue is None else queue * MS,
            "time_to_first_token_ms": None if prefill is None else prefill * MS}


def origin(raw: Mapping | VllmBenchFile, source: str) -> float:
    """The run's zero (``_zero``) on the Unix clock, for a file written on this host since its
    last boot: vLLM's perf_counter is this host's monotonic clock, which every process on it
    shares, so this host's offset now places it (as `cbbench serve` places its log's times).
    Checked against the file's date; a file from elsewhere is refused."""
    data = _file(raw)
    date = data.date
    if not isinstance(date, str):
        raise UsageError(f"{source} has no date to check --same-host against")
    try:
        stamped = dt.datetime.strptime(date, DATE_FORMAT).timestamp()  # naive: local time
    except ValueError:
        raise UsageError(f"{source}: date {date!r} is not vLLM's %Y%m%d-%H%M%S") from None
    offset = perf_minus_epoch()
    t0 = _zero(data, source) - offset
    last_send = max((_clock_reading(s, source, "start_times") for s in data.start_times),
                    default=0.0) - offset
    d = data.duration
    late = stamped - max(last_send, t0 + float(d) if is_finite(d) else last_send)
    if not -DATE_EARLY_S <= late <= DATE_LATE_S:
        raise UsageError(
            f"{source} was not written on this host since its last boot (its date is "
            f"{late:+.0f} s from its times on this host's clock): drop --same-host"
        )
    return t0


def _token_times(data: VllmBenchFile, i: int, start: float, latencies,
                 source: str) -> tuple[list[float], bool]:
    """(the times of the request's chunks, True), or, with no gaps but a latency and several
    tokens, (the first token's and the end, False): not chunks, whose tokens are not split."""
    first = start + _number(data.ttfts[i], source, "ttfts")
    times = [first]
    gaps = data.itls[i]
    if not isinstance(gaps, list):
        raise UsageError(f"{source}: itls[{i}] is not a list")
    for gap in gaps:
        times.append(times[-1] + _number(gap, source, "itls"))
    if not gaps and isinstance(latencies, list) and data.output_lens[i] > 1:
        times.append(start + _number(latencies[i], source, "latencies"))
        return times, False
    return times, True


def config(raw: Mapping | VllmBenchFile) -> dict:
    data = _file(raw)
    rate = data.request_rate
    return {
        **base_config(TOOL, len(data.ttfts)),
        "label": data.label,
        "workload": data.dataset_name or "unknown",
        "request_rate": "inf" if rate in (None, "inf") or _is_inf(rate) else rate,
        "endpoint": data.base_url,
        "api": data.backend,
        "served_model": data.model_id,
        "model": data.model_id,
        "max_concurrency": data.max_concurrency,
        "burstiness": data.burstiness,
    }


def started_at(raw: Mapping | VllmBenchFile, t0_epoch: float | None = None) -> str | None:
    """When the run started (UTC): its zero on the Unix clock when known (--same-host), else
    the file's date -- vLLM's local time when the run ended -- less the run's duration."""
    data = _file(raw)
    if t0_epoch is not None:
        return dt.datetime.fromtimestamp(t0_epoch, dt.timezone.utc).isoformat()
    date = data.date
    if not isinstance(date, str):
        return None
    try:
        end = dt.datetime.strptime(date, DATE_FORMAT).astimezone(dt.timezone.utc)
    except ValueError:
        return None
    if (d := positive(data.duration)) is not None:
        end -= dt.timedelta(seconds=round(d))
    return end.isoformat()


def _is_inf(v) -> bool:
    return isinstance(v, float) and math.isinf(v)


def _number(v, source: str, key: str) -> float:
    return number(v, source, key, "a time in seconds", 0)


def _clock_reading(v, source: str, key: str) -> float:
    """A perf_counter reading (s): any finite number, below zero too. Python leaves
    perf_counter's zero undefined, and a file from before this host's last boot, moved onto
    its clock, reads below zero here: `origin` refuses such a file for its date, by name."""
    return number(v, source, key, "a clock reading in seconds")
