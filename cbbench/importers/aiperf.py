"""AIPerf's per-request records (`profile_export.jsonl`, one MetricRecordInfo a line) -> a
cbbench result.

Each line holds ``metadata`` (wall-clock ``request_start_ns`` at the send, ``request_end_ns``,
``credit_issued_ns`` when AIPerf's rate limiter released the request, ``x_request_id``,
``benchmark_phase``), ``metrics`` (tag -> ``{"value", "unit"}`` in display units:
``time_to_first_token``, ``request_latency`` and ``inter_chunk_latency`` in ms,
``output_sequence_length`` and ``input_sequence_length`` in tokens; for a reasoning model
``usage_reasoning_tokens``/``reasoning_token_count`` and ``time_to_first_output_token``) and
``error`` (null, or
``{"code", "type", "message"}``); aiperf/common/models/record_models.py defines them.

The intended start is the credit's release where AIPerf recorded it (the schedule's slot, so
TTFT and E2EL count from it as a cbbench run does and the send lag is the gap to the send),
else the send. Warm-up records are left out, as AIPerf leaves them out of its own figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError

TOOL = "aiperf"
NS = 1e-9
MS = 1e-3
WARMUP_PHASE = "warmup"
TIME_UNITS_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def lines(path) -> list[tuple[int, dict]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [_record(path, n, line) for n, line in enumerate(f, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _record(path, n: int, line: str) -> tuple[int, dict]:
    try:
        obj = json.loads(line)
    except ValueError:
        raise UsageError(f"{path}:{n} is not JSON: not an AIPerf profile_export.jsonl") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise UsageError(f"{path}:{n} has no metadata: not an AIPerf record")
    return n, obj


def _profiling(objs: Iterable[tuple[int, dict]], source: str) -> list[tuple[int, dict]]:
    rows = [(n, o) for n, o in objs if o["metadata"].get("benchmark_phase") != WARMUP_PHASE]
    if not rows:
        raise UsageError(f"{source} holds no profiling records")
    return rows


def _slots(rows: list[tuple[int, dict]], source: str) -> tuple[list[int], list[int]]:
    """(send, intended start) per record, in ns on AIPerf's wall clock (time.time_ns)."""
    starts = [_ns(o["metadata"], "request_start_ns", f"{source}:{n}") for n, o in rows]
    issued = [o["metadata"].get("credit_issued_ns") for _, o in rows]
    return starts, [i if isinstance(i, int) and not isinstance(i, bool) else s
                    for i, s in zip(issued, starts)]


def origin(objs: Iterable[tuple[int, dict]], source: str = "") -> float:
    """The records' zero on the Unix clock (s): AIPerf stamps with time.time_ns()."""
    return min(_slots(_profiling(objs, source), source)[1]) * NS


def records(objs: Iterable[tuple[int, dict]], source: str) -> list[RequestRecord]:
    rows = _profiling(objs, source)
    starts, slots = _slots(rows, source)
    t0 = min(slots)
    out = []
    for i, ((n, obj), start_ns, slot_ns) in enumerate(zip(rows, starts, slots)):
        where = f"{source}:{n}"
        metrics = obj.get("metrics") or {}
        send = (start_ns - t0) * NS
        rec = RequestRecord(
            id=i,
            prompt_tokens=_tokens(metrics, "input_sequence_length", where),
            output_tokens=_tokens(metrics, "output_sequence_length", where),
            intended_start_s=(slot_ns - t0) * NS,
            send_s=send,
            server_request_id=obj["metadata"].get("x_request_id"),
        )
        # Counted by the tool (its tokenizer or the server's usage): recorded as its count.
        rec.output_tokens_method = TOOL
        rec.output_token_counts = {TOOL: rec.output_tokens}
        error = obj.get("error")
        if error:
            rec.error = str(error.get("message") if isinstance(error, dict) else error)
            rec.error_type = str(error.get("type") or "error") if isinstance(error, dict) else "error"
        else:
            rec.token_times_s = _token_times(metrics, send, rec.output_tokens, where)
            _reasoning(rec, metrics, send, where)
        out.append(rec)
    return out


def _reasoning(rec: RequestRecord, metrics: Mapping, send: float, where: str) -> None:
    """A reasoning model's figures as AIPerf recorded them: the reasoning tokens (the server's
    usage, else AIPerf's count) and the first answer token (time_to_first_output_token)."""
    for tag in ("usage_reasoning_tokens", "reasoning_token_count"):
        if tag in metrics:
            rec.reasoning_tokens = _tokens(metrics, tag, where)
            break
    if rec.reasoning_tokens and "time_to_first_output_token" in metrics:
        rec.first_output_s = send + _seconds(metrics, "time_to_first_output_token", where)


def _token_times(metrics: Mapping, send: float, output_tokens: int, where: str) -> list[float]:
    first = send + _seconds(metrics, "time_to_first_token", where)
    times = [first]
    chunks = metrics.get("inter_chunk_latency")
    if isinstance(chunks, dict) and isinstance(chunks.get("value"), list):
        scale = _unit(chunks, where, "inter_chunk_latency")
        for gap in chunks["value"]:
            times.append(times[-1] + _finite(gap, where, "inter_chunk_latency") * scale)
    elif output_tokens > 1 and "request_latency" in metrics:
        times.append(send + _seconds(metrics, "request_latency", where))
    return times


def _seconds(metrics: Mapping, tag: str, where: str) -> float:
    m = metrics.get(tag)
    if not isinstance(m, dict):
        raise UsageError(f"{where}: a completed record without {tag}")
    return _finite(m.get("value"), where, tag) * _unit(m, where, tag)


def _unit(m: Mapping, where: str, tag: str) -> float:
    unit = m.get("unit")
    if unit not in TIME_UNITS_S:
        raise UsageError(f"{where}: {tag} in unit {unit!r}, not one of {', '.join(TIME_UNITS_S)}")
    return TIME_UNITS_S[unit]


def _tokens(metrics: Mapping, tag: str, where: str) -> int:
    m = metrics.get(tag)
    if m is None:
        return 0
    v = m.get("value") if isinstance(m, dict) else None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UsageError(f"{where}: {tag} holds {v!r}, not a token count")
    return v


def _ns(meta: Mapping, key: str, where: str) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UsageError(f"{where}: metadata.{key} holds {v!r}, not a time in ns")
    return v


def _finite(v, where: str, tag: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise UsageError(f"{where}: {tag} holds {v!r}, not a duration")
    return float(v)


def config(recs: list[RequestRecord]) -> dict:
    return {
        "label": None,
        "imported_from": TOOL,
        "workload": "unknown",
        "num_requests": len(recs),
        "request_rate": None,
        "target": "http",
    }


def duration_s(recs: list[RequestRecord]) -> float:
    ends = [r.token_times_s[-1] for r in recs if r.token_times_s]
    return max(ends) if ends else 0.0
