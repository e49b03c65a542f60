"""AIPerf's per-request records (`profile_export.jsonl`, one MetricRecordInfo a line) -> a
cbbench result.

Each line holds ``metadata`` (wall-clock ``request_start_ns`` at the send, ``request_end_ns``,
``credit_issued_ns`` when AIPerf's rate limiter released the request, ``x_request_id``,
``benchmark_phase``, ``was_cancelled``), ``metrics`` (tag -> ``{"value", "unit"}`` in display units:
``time_to_first_token``, ``request_latency`` and ``inter_chunk_latency`` in ms,
``output_sequence_length`` and ``input_sequence_length`` (``error_isl`` for an errored
request) in tokens; for a reasoning model
``usage_reasoning_tokens``/``reasoning_token_count`` and ``time_to_first_output_token``) and
``error`` (null, or
``{"code", "type", "message"}``); aiperf/common/models/record_models.py defines them.

The intended start is the credit's release where AIPerf recorded it (the schedule's slot, so
TTFT and E2EL count from it as a cbbench run does and the send lag is the gap to the send),
else the send. Warm-up records are left out, as AIPerf leaves them out of its own figures.

AIPerf times each streamed chunk (``inter_chunk_latency``) but does not say how many tokens a
chunk held, and cbbench's ITL is per token (a chunk of k tokens after a gap g is k gaps of
g / k). Where the counts fix it (as many chunks as output tokens: one each; a single chunk:
all) the split is exact (method ``chunk_count``); otherwise the output tokens are spread over
the chunks (fields.chunk_tokens: the first one token, the rest shared evenly; method
``spread``), so per-token ITL keeps AIPerf's own mean -- (E2EL - TTFT) / (OSL - 1), its
``inter_token_latency`` -- where one token per chunk made it a per-chunk gap under a per-token
name, and tokens per event its true mean (output tokens over chunks). The per-chunk gaps are
``event_gap_ms``, AIPerf's ``inter_chunk_latency``, unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.importers.fields import ToolFields, chunk_tokens, count, number, part

TOOL = "aiperf"
NS = 1e-9
MS = 1e-3
WARMUP_PHASE = "warmup"
RAW_KEY = "responses"  # --export-level raw's other file: each request's responses, not metrics
DURATION = "a duration"  # what a latency metric holds
TIME_UNITS_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# The farthest a record's times may lie from its run's (s): its send from the median send of
# the records, its credit's release from its send. A profile run lasts minutes to hours, and a
# credit waits for its worker no longer than the run; a time a day away is not one of this
# run: a credit_issued_ns of 0 (1970) imported, exit 0, as a run of 55 years with a TTFT mean
# of 3.5e11 ms, since the intended start counts from it.
MAX_RUN_SPAN_S = 86_400


class Line(ToolFields):
    """One MetricRecordInfo."""

    metadata: Any = None
    metrics: Any = None
    error: Any = None  # null, or {"code", "type", "message"}


class Metadata(ToolFields):
    request_start_ns: Any = None  # the send, on time.time_ns()
    credit_issued_ns: Any = None  # the rate limiter's release
    x_request_id: Any = None
    benchmark_phase: Any = None
    was_cancelled: Any = None  # AIPerf cancelled it (--request-cancellation-rate)


class Metric(ToolFields):
    """One metric in display units: a number (or a list of them) and its unit."""

    value: Any = None
    unit: Any = None


class Metrics(ToolFields):
    """The metrics read, by tag (each a Metric where present)."""

    time_to_first_token: Any = None
    request_latency: Any = None
    inter_chunk_latency: Any = None
    output_sequence_length: Any = None
    input_sequence_length: Any = None
    error_isl: Any = None  # an errored request's input length (it has no input_sequence_length)
    usage_reasoning_tokens: Any = None  # the server's usage
    reasoning_token_count: Any = None  # AIPerf's own count
    time_to_first_output_token: Any = None


class ErrorInfo(ToolFields):
    type: Any = None
    message: Any = None


@dataclass(frozen=True)
class Row:
    """One line of the file: its number (for messages) and its parts."""

    n: int
    meta: Metadata
    metrics: Any  # an object of Metrics' fields, or empty (an errored record)
    error: Any


def lines(path) -> list[Row]:
    try:
        with open(path, encoding="utf-8") as f:
            return [_record(path, n, line) for n, line in enumerate(f, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _record(path, n: int, text: str) -> Row:
    try:
        obj = json.loads(text)
    except ValueError:
        raise UsageError(f"{path}:{n} is not JSON: not an AIPerf profile_export.jsonl") from None
    line = Line.model_validate(obj) if isinstance(obj, dict) else None
    if line is not None and line.metrics is None and RAW_KEY in obj:
        raise UsageError(f"{path}:{n} is AIPerf's raw export (profile_export_raw.jsonl: "
                         "requests and responses, no metrics): import profile_export.jsonl "
                         "from the same directory instead")
    if line is None or not isinstance(line.metadata, dict):
        raise UsageError(f"{path}:{n} has no metadata: not an AIPerf record")
    return Row(n, Metadata.model_validate(line.metadata), line.metrics, line.error)


def _profiling(rows: Iterable[Row], source: str) -> list[Row]:
    kept = [r for r in rows if r.meta.benchmark_phase != WARMUP_PHASE]
    if not kept:
        raise UsageError(f"{source} holds no profiling records")
    return kept


def _slots(rows: list[Row], source: str) -> tuple[list[int], list[int]]:
    """(send, intended start) per record, in ns on AIPerf's wall clock (time.time_ns)."""
    starts = [count(r.meta.request_start_ns, f"{source}:{r.n}", "metadata.request_start_ns",
                    "a time in ns") for r in rows]
    issued = [r.meta.credit_issued_ns for r in rows]
    slots = [i if isinstance(i, int) and not isinstance(i, bool) else s
             for i, s in zip(issued, starts)]
    _check_span(rows, starts, slots, source)
    return starts, slots


def _check_span(rows: list[Row], starts: list[int], slots: list[int], source: str) -> None:
    """UsageError naming the first record whose send, or credit, lies more than
    MAX_RUN_SPAN_S from its run's (the median send; its own send)."""
    span_ns = MAX_RUN_SPAN_S * 10**9
    mid = statistics.median_low(starts)
    for r, start, slot in zip(rows, starts, slots):
        if abs(start - mid) > span_ns:
            raise UsageError(f"{source}:{r.n}: metadata.request_start_ns {start} is "
                             f"{(start - mid) * NS:+.4g} s from the records' median send, more "
                             f"than a run's {MAX_RUN_SPAN_S} s: not a time of this run")
        if abs(start - slot) > span_ns:
            raise UsageError(f"{source}:{r.n}: metadata.credit_issued_ns {slot} is "
                             f"{(start - slot) * NS:.4g} s before its send, more than a run's "
                             f"{MAX_RUN_SPAN_S} s: not a time of this run")


def origin(rows: Iterable[Row], source: str = "") -> float:
    """The records' zero on the Unix clock (s): AIPerf stamps with time.time_ns()."""
    return min(_slots(_profiling(rows, source), source)[1]) * NS


def started_at(t0_epoch_s: float) -> str:
    """When the run started (UTC, to the second, as a run's started_at): the records' zero."""
    return dt.datetime.fromtimestamp(t0_epoch_s, dt.timezone.utc).isoformat(timespec="seconds")


def records(rows: Iterable[Row], source: str) -> list[RequestRecord]:
    kept = _profiling(rows, source)
    starts, slots = _slots(kept, source)
    t0 = min(slots)
    out = []
    for i, (row, start_ns, slot_ns) in enumerate(zip(kept, starts, slots)):
        where = f"{source}:{row.n}"
        metrics = part(Metrics, row.metrics, where, "metrics", TOOL)
        send = (start_ns - t0) * NS
        isl = "error_isl" if metrics.input_sequence_length is None else "input_sequence_length"
        rec = RequestRecord(
            id=i,
            prompt_tokens=_tokens(getattr(metrics, isl), isl, where),
            output_tokens=_tokens(metrics.output_sequence_length, "output_sequence_length",
                                  where),
            intended_start_s=(slot_ns - t0) * NS,
            send_s=send,
            server_request_id=row.meta.x_request_id,
        )
        # Counted by the tool (its tokenizer or the server's usage): recorded as its count.
        rec.output_tokens_method = TOOL
        rec.output_token_counts = {TOOL: rec.output_tokens}
        error = row.error
        if row.meta.was_cancelled is True:
            # The client gave up on it by design (its error a 499 RequestCancellationError,
            # which AIPerf's summary counts among its errors): cancelled, not failed, as a
            # cbbench --cancel-rate run records its own, so `failed` means the same for both.
            rec.cancelled = True
        elif error and isinstance(error, dict):
            err = ErrorInfo.model_validate(error)
            rec.error, rec.error_type = str(err.message), str(err.type or "error")
        elif error:
            rec.error, rec.error_type = str(error), "error"
        else:
            rec.token_times_s, chunked = _token_times(metrics, send, rec.output_tokens, where)
            if chunked and (split := chunk_tokens(len(rec.token_times_s), rec.output_tokens)):
                rec.event_tokens, rec.event_tokens_method = split
            _reasoning(rec, metrics, send, where)
        out.append(rec)
    return out


def _reasoning(rec: RequestRecord, metrics: Metrics, send: float, where: str) -> None:
    """A reasoning model's figures as AIPerf recorded them: the reasoning tokens (the server's
    usage, else AIPerf's count) and the first answer token (time_to_first_output_token)."""
    present = metrics.model_fields_set
    if "usage_reasoning_tokens" in present:
        rec.reasoning_tokens = _tokens(metrics.usage_reasoning_tokens, "usage_reasoning_tokens",
                                       where)
    elif "reasoning_token_count" in present:
        rec.reasoning_tokens = _tokens(metrics.reasoning_token_count, "reasoning_token_count",
                                       where)
    if rec.reasoning_tokens and "time_to_first_output_token" in present:
        rec.first_output_s = send + _seconds(metrics.time_to_first_output_token,
                                             "time_to_first_output_token", where)


def _token_times(metrics: Metrics, send: float, output_tokens: int,
                 where: str) -> tuple[list[float], bool]:
    """(the times of the streamed chunks, True), or, without inter_chunk_latency, (the first
    token's and the request's end, False): not chunks, whose tokens are then not split; not
    streamed (no time_to_first_token), (the request's end, True): one chunk of every token."""
    if metrics.time_to_first_token is None and metrics.request_latency is not None:
        # Not streamed (AIPerf records no TTFT then): the whole answer at the end, one event.
        return [send + _seconds(metrics.request_latency, "request_latency", where)], True
    first = send + _seconds(metrics.time_to_first_token, "time_to_first_token", where)
    times = [first]
    chunks = metrics.inter_chunk_latency
    gaps = Metric.model_validate(chunks) if isinstance(chunks, dict) else None
    if gaps is not None and isinstance(gaps.value, list):
        scale = _unit(gaps, where, "inter_chunk_latency")
        for gap in gaps.value:
            times.append(times[-1] + number(gap, where, "inter_chunk_latency", DURATION, 0) * scale)
        return times, True
    if output_tokens > 1 and "request_latency" in metrics.model_fields_set:
        times.append(send + _seconds(metrics.request_latency, "request_latency", where))
        return times, False
    return times, True  # one chunk


def _seconds(m: Any, tag: str, where: str) -> float:
    """Metric ``tag`` (``m``, as written) in seconds."""
    if not isinstance(m, dict):
        raise UsageError(f"{where}: a completed record without {tag}")
    metric = Metric.model_validate(m)
    return number(metric.value, where, tag, DURATION, 0) * _unit(metric, where, tag)


def _unit(m: Metric, where: str, tag: str) -> float:
    unit = m.unit
    if unit not in TIME_UNITS_S:
        raise UsageError(f"{where}: {tag} in unit {unit!r}, not one of {', '.join(TIME_UNITS_S)}")
    return TIME_UNITS_S[unit]


def _tokens(m: Any, tag: str, where: str) -> int:
    """Metric ``tag`` (``m``, as written) as a token count; absent: 0."""
    if m is None:
        return 0
    v = Metric.model_validate(m).value if isinstance(m, dict) else None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return count(v, where, tag)
