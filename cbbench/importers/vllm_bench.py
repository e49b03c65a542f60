"""vLLM bench (`vllm bench serve --save-result --save-detailed`) -> a cbbench result.

vLLM's result JSON keeps, with --save-detailed, one list entry per request in send order:
``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (s, one gap per streamed chunk),
``latencies`` (s), ``start_times`` (perf_counter at the send, s) and ``errors`` ("" when the
request succeeded); the run's ``duration`` (s), ``date`` (%Y%m%d-%H%M%S), ``model_id``,
``request_rate`` and ``max_concurrency`` beside them (vllm/benchmarks/serve.py).

What carries over, and how it differs from a cbbench run of the same load:
- vLLM times TTFT and E2EL from the actual send, not from an intended schedule (it keeps
  none), so the imported intended start is the send and the send lag is unknown (null);
- ITL is vLLM's: one gap per chunk. A chunk of several tokens is one gap, as vLLM counts it;
- a request's token times are its chunk times (first token, then each gap), with vLLM's
  output length as the token count, so TPOT is (E2EL - TTFT) / (output - 1) as in vLLM.
The summary is then cbbench's own (the same functions as a run), so compare and gate treat an
imported file like any other.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError

TOOL = "vllm-bench"
PER_REQUEST_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")
DATE_FORMAT = "%Y%m%d-%H%M%S"


def records(data: Mapping, source: str) -> list[RequestRecord]:
    missing = [k for k in PER_REQUEST_KEYS if not isinstance(data.get(k), list)]
    if missing:
        raise UsageError(
            f"{source} has no per-request {', '.join(missing)}: run vllm bench serve with "
            "--save-result --save-detailed"
        )
    n = len(data["ttfts"])
    if any(len(data[k]) != n for k in PER_REQUEST_KEYS):
        raise UsageError(f"{source}: its per-request lists have different lengths")
    latencies = data.get("latencies")
    starts = [_number(s, source, "start_times") for s in data["start_times"]]
    t0 = min(starts) if starts else 0.0
    out = []
    for i in range(n):
        start = starts[i] - t0
        rec = RequestRecord(
            id=i,
            prompt_tokens=_count(data["input_lens"][i], source, "input_lens"),
            output_tokens=_count(data["output_lens"][i], source, "output_lens"),
            intended_start_s=start,
            send_s=start,
        )
        # Counted by the tool (its tokenizer or the server's usage): recorded as its count.
        rec.output_tokens_method = TOOL
        rec.output_token_counts = {TOOL: rec.output_tokens}
        error = data["errors"][i]
        if error:
            rec.error = str(error)
            rec.error_type = "error"
        else:
            rec.token_times_s = _token_times(data, i, start, latencies, source)
        out.append(rec)
    return out


def _token_times(data: Mapping, i: int, start: float, latencies, source: str) -> list[float]:
    first = start + _number(data["ttfts"][i], source, "ttfts")
    times = [first]
    gaps = data["itls"][i]
    if not isinstance(gaps, list):
        raise UsageError(f"{source}: itls[{i}] is not a list")
    for gap in gaps:
        times.append(times[-1] + _number(gap, source, "itls"))
    if not gaps and isinstance(latencies, list) and data["output_lens"][i] > 1:
        times.append(start + _number(latencies[i], source, "latencies"))
    return times


def config(data: Mapping) -> dict:
    rate = data.get("request_rate")
    return {
        "label": data.get("label"),
        "imported_from": TOOL,
        "workload": data.get("dataset_name") or "unknown",
        "num_requests": len(data["ttfts"]),
        "request_rate": "inf" if rate in (None, "inf") or _is_inf(rate) else rate,
        "target": "http",
        "endpoint": data.get("base_url"),
        "api": data.get("backend"),
        "served_model": data.get("model_id"),
        "model": data.get("model_id"),
        "max_concurrency": data.get("max_concurrency"),
        "burstiness": data.get("burstiness"),
    }


def started_at(data: Mapping) -> str | None:
    date = data.get("date")
    if not isinstance(date, str):
        return None
    try:
        return dt.datetime.strptime(date, DATE_FORMAT).replace(tzinfo=dt.timezone.utc).isoformat()
    except ValueError:
        return None


def duration_s(data: Mapping, recs: list[RequestRecord]) -> float:
    d = data.get("duration")
    if isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) and d > 0:
        return float(d)
    ends = [r.token_times_s[-1] for r in recs if r.token_times_s]
    return max(ends) if ends else 0.0


def _is_inf(v) -> bool:
    return isinstance(v, float) and math.isinf(v)


def _number(v, source: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise UsageError(f"{source}: {key} holds {v!r}, not a time in seconds")
    return float(v)


def _count(v, source: str, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UsageError(f"{source}: {key} holds {v!r}, not a token count")
    return v
