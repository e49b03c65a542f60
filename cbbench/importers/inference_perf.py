"""inference-perf's per-request report (`per_request_lifecycle_metrics.json`, written with
``report.request_lifecycle.per_request: true``) -> a cbbench result.

The report is a JSON list, one entry per request (inference_perf/reportgen/base.py):
``start_time`` and ``end_time`` (time.perf_counter() seconds in the load generator: one clock
per run, arbitrary origin), ``request`` (the body sent, as text), ``response`` (the raw answer),
``info`` (InferenceInfo: ``request_metrics.text.input_tokens``, ``response_metrics`` with
``output_tokens``, ``server_usage``, and for a streamed answer ``chunk_times`` (one per chunk
that carried text), ``response_chunks`` (those chunks' JSON) and ``output_token_times`` (one per
token, each at its chunk's time, when inference-perf re-tokenized the chunks), ``lora_adapter``)
and ``error`` (null, or ``{"error_type", "error_msg"}``).

What carries over, and how it differs from a cbbench run of the same load:
- the report keeps no scheduled time, only the send: the intended start is the send and the
  send lag 0 (inference-perf's own schedule deltas are in its summary report only);
- a request's events are its text chunks; the tokens each carried are the runs of equal times
  in ``output_token_times`` where those match the chunks, else one per chunk; the output count
  is the server's ``usage.completion_tokens`` when it sent one, else inference-perf's count;
- reasoning chunks carry no text (only ``delta.content`` is timed), so TTFT is inference-perf's:
  the first answer token's;
- per request ``model``: its adapter (``lora_adapter``), else the body's ``model``.
"""

from __future__ import annotations

import json
from typing import Any

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.importers.fields import ToolFields, base_config, count, number, part

TOOL = "inference-perf"


class Entry(ToolFields):
    """One request of the report (inference_perf/reportgen/base.py)."""

    start_time: Any = None
    end_time: Any = None
    request: Any = None  # the body sent, as text
    info: Any = None  # an InferenceInfo (checked by entries)
    error: Any = None  # null, or {"error_type", "error_msg"}


class Info(ToolFields):
    """InferenceInfo."""

    request_metrics: Any = None
    response_metrics: Any = None
    input_tokens: Any = 0  # older reports: beside the metrics, not in them
    lora_adapter: Any = None


class RequestMetrics(ToolFields):
    text: Any = None


class TextMetrics(ToolFields):
    input_tokens: Any = None


class ResponseMetrics(ToolFields):
    output_tokens: Any = 0
    server_usage: Any = None
    response_chunks: Any = None
    chunk_times: Any = None
    output_token_times: Any = None


class Usage(ToolFields):
    """The server's usage, as the answer sent it."""

    completion_tokens: Any = None
    prompt_tokens: Any = None


class ErrorInfo(ToolFields):
    error_type: Any = None
    error_msg: Any = None


class Body(ToolFields):
    """The request body sent (JSON text in the report)."""

    model: Any = None


class Chunk(ToolFields):
    """One streamed answer chunk (JSON text in the report)."""

    id: Any = None


def entries(data, source: str) -> list[Entry]:
    if not isinstance(data, list):
        raise UsageError(f"{source} is not an inference-perf per-request report (a JSON list; "
                         "per_request_lifecycle_metrics.json)")
    if not data:
        raise UsageError(f"{source} holds no requests")
    out = []
    for i, e in enumerate(data):
        entry = Entry.model_validate(e) if isinstance(e, dict) else None
        if entry is None or "start_time" not in entry.model_fields_set \
                or not isinstance(entry.info, dict):
            raise UsageError(f"{source}: entry {i} has no start_time and info: not an "
                             "inference-perf request")
        out.append(entry)
    return out


def records(data: list[Entry], source: str) -> list[RequestRecord]:
    starts = [_time(e.start_time, f"{source}: entry {i}", "start_time")
              for i, e in enumerate(data)]
    t0 = min(starts)
    order = sorted(range(len(data)), key=starts.__getitem__)  # in send order
    return [_record(k, data[i], starts[i] - t0, t0, f"{source}: entry {i}")
            for k, i in enumerate(order)]


def _record(k: int, e: Entry, start: float, t0: float, where: str) -> RequestRecord:
    info = Info.model_validate(e.info)
    metrics = part(ResponseMetrics, info.response_metrics, where, "info.response_metrics", TOOL)
    usage = part(Usage, metrics.server_usage, where, "info.response_metrics.server_usage", TOOL)
    body = _json(e.request)
    request_metrics = part(RequestMetrics, info.request_metrics, where, "info.request_metrics",
                           TOOL)
    text = part(TextMetrics, request_metrics.text, where, "info.request_metrics.text", TOOL)
    rec = RequestRecord(
        id=k,
        prompt_tokens=count(text.input_tokens if "input_tokens" in text.model_fields_set
                             else info.input_tokens, where, "input_tokens"),
        output_tokens=0,
        intended_start_s=start,
        send_s=start,
    )
    counted = count(metrics.output_tokens, where, "output_tokens")
    server = usage.completion_tokens
    rec.output_tokens = server if type(server) is int and server >= 0 else counted
    rec.output_tokens_method = TOOL
    rec.output_token_counts = {TOOL: counted, **({"usage": server} if type(server) is int else {})}
    if type(usage.prompt_tokens) is int:
        rec.server_prompt_tokens = usage.prompt_tokens
    rec.model = info.lora_adapter or (Body.model_validate(body).model
                                      if isinstance(body, dict) else None)
    chunks = metrics.response_chunks or []
    first_chunk = _json(chunks[0]) if chunks else None
    if isinstance(first_chunk, dict):
        rec.server_request_id = Chunk.model_validate(first_chunk).id
    error = e.error
    if error:
        if isinstance(error, dict):
            err = ErrorInfo.model_validate(error)
            rec.error, rec.error_type = str(err.error_msg), str(err.error_type or "error")
        else:
            rec.error, rec.error_type = str(error), "error"
        return rec
    times = [_time(t, where, "chunk_times") - t0 for t in metrics.chunk_times or []]
    if not times:  # not streamed: the whole answer at the end
        times = [_time(e.end_time, where, "end_time") - t0]
    rec.token_times_s = times
    rec.event_tokens = _per_chunk(metrics.output_token_times or [], metrics.chunk_times or [])
    rec.event_tokens_method = TOOL if rec.event_tokens is not None else None
    return rec


def _per_chunk(token_times: list, chunk_times: list) -> list[int] | None:
    """Tokens per chunk: the runs of equal times in output_token_times, when they fall on the
    chunks' own times (inference-perf re-tokenized each chunk); None otherwise."""
    if not token_times or len(token_times) <= len(chunk_times):
        return None
    runs: list[list] = []
    for t in token_times:
        if runs and t == runs[-1][0]:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    if [r[0] for r in runs] != list(chunk_times):
        return None
    return [r[1] for r in runs]


def _json(text):
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


def _time(v, where: str, key: str) -> float:
    """A perf_counter reading (s): any finite number, below zero too. Python leaves
    perf_counter's zero undefined and only differences are used here (each time less the
    first send), so a report whose times read below zero (back-dated past a recent boot, or
    from another clock) imports as any other (issue 35, item 1)."""
    return number(v, where, key, "a time in seconds")


def config(recs: list[RequestRecord]) -> dict:
    models = sorted({r.model for r in recs if r.model})
    model = models[0] if len(models) == 1 else None
    return {**base_config(TOOL, len(recs)), "served_model": model, "model": model}


def duration_s(data: list[Entry], recs: list[RequestRecord]) -> float:
    """inference-perf's total time: last end - first start."""
    starts = [e.start_time for e in data]
    ends = [float(e.end_time) for e in data if isinstance(e.end_time, (int, float))]
    return float(max(ends) - min(starts)) if ends else 0.0
