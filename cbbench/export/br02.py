"""A cbbench result as llm-d's Benchmark Report v0.2 (llm-d/llm-d-benchmark,
llmdbenchmark/analysis/benchmark_report/schema_v0_2.py and its JSON Schema).

The field mapping follows llm-d's own converters (native_to_br0_2.py's vLLM-bench import):
TTFT and E2EL in ms, TPOT and ITL in ms/token, rates as their run-wide means; run.time from
the result's start and duration. Under a --max-concurrency cap TTFT, E2EL and NTPOT count
from the send (summary.from_send), as vLLM bench counts them; in an open loop from the
intended start (the result's own figures). Where cbbench has per-request figures (TTFT,
TPOT, E2EL, lengths) every statistic the schema names is filled from them with the same linear
interpolation as cbbench's own summary (numpy.percentile), so the report's p50/p90/p95/p99
equal the result's. ITL is pooled per token: from the per-request lists when the result was
saved with --save-detailed, else the summary's figures only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from cbbench.errors import UsageError
from cbbench.export import requests as R
from cbbench.export.writable import clean, clean_texts
from cbbench.finite import is_finite
from cbbench.schema.base import is_empty, to_dict
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Config, Distribution, Request, RunResult, Summary

VERSION = "0.2"
TOOL = "cbbench"
# The schema's statistic keys and the percentiles they stand for.
PERCENTILE_KEYS = {
    "p0p1": 0.1, "p1": 1.0, "p5": 5.0, "p10": 10.0, "p25": 25.0, "p50": 50.0,
    "p75": 75.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99p9": 99.9,
}
# Workloads whose prompts are random tokens (random-mm: with images), not drawn from data.
RANDOM_WORKLOADS = ("random", "random-mm")
# What an import writes as the workload when the tool's file does not say (importers/fields.py).
UNKNOWN_WORKLOAD = "unknown"
UID_LENGTH = 32  # llm-d's ids are 32 hex digits (md5-sized)
# The error type of a request still in flight when the run stopped (a run's Ctrl-C, a GuideLLM
# benchmark's end), counted among the summary's failed: llm-d's "incomplete" (not completed),
# not its "failures" (answered with an error), as its GuideLLM converter splits them.
INTERRUPTED = "interrupted"


def to_br02(result: RunResult | Mapping[str, Any]) -> dict:
    run = as_run(result)
    # The result as the file's JSON, cleaned (export/writable.py): what the ids digest and the
    # native configuration holds.
    plain = clean(to_dict(run))
    config = clean(to_dict(run.config))
    requests = run.requests or []
    done = R.completed(requests)
    report = {
        "version": VERSION,
        "run": _run(run, plain, config),
        "scenario": {"stack": [_stack_component(run, config)],
                     "load": _load(run.config, config, done, run.summary)},
        "results": {
            "request_performance": {
                "aggregate": {
                    "requests": _requests(run.summary, requests, done),
                    "latency": _latency(run.summary, done),
                    "throughput": _throughput(run.summary),
                }
            }
        },
    }
    # Read from the model, the texts are the file's: made writable as the cleaned result's.
    return clean_texts(_drop_none(report))


def _run(run: RunResult, plain: dict, config: dict) -> dict:
    start = _parse_time(run.started_at)
    duration = run.summary.duration_s
    time: dict = {}
    if start is not None:
        time["start"] = start.isoformat().replace("+00:00", "Z")
        if is_finite(duration):
            end = start + dt.timedelta(seconds=duration)
            time["end"] = end.isoformat().replace("+00:00", "Z")
    if is_finite(duration):
        time["duration"] = f"PT{duration}S"
    c = run.config
    return {
        # The same result always gets the same uid; runs of one configuration share the eid.
        "uid": _digest(plain)[:UID_LENGTH],
        "eid": _digest(_config_identity(config))[:UID_LENGTH],
        "time": time or None,
        "description": c.label,
        # No "keywords": llm-d reserves them for the submitter's curated tags, never
        # machine-made (its SUBMISSION_POLICY.md; native_to_br0_2.py writes only --run-keywords).
    }


def _config_identity(config: dict) -> dict:
    """The configuration without what differs between repeats of one experiment."""
    return {k: v for k, v in config.items() if k not in ("command", "label")}


def _stack_component(run: RunResult, config: dict) -> dict:
    c = run.config
    native = {"config": _jsonable(config)}
    if c.target == "http":
        return {
            "metadata": {"label": "endpoint", "cfg_id": _digest(config)[:UID_LENGTH]},
            # cbbench sees an endpoint from outside: what serves it is not known here.
            "standardized": {"kind": "generic", "tool": "openai-compatible-endpoint",
                             "tool_version": "unknown"},
            "native": native,
        }
    tp = _parallel_size(c.tensor_parallel_size)
    dp = _parallel_size(c.data_parallel_size)
    engine = c.engine or "engine"
    accelerator = c.gpu if engine == "sim" else (c.device or "unknown")
    return {
        "metadata": {
            "label": f"cbbench-{engine}",
            "cfg_id": _digest(config)[:UID_LENGTH],
            "description": "cbbench's bundled engine"
            + (" on a simulated GPU" if engine == "sim" else ""),
        },
        "standardized": {
            "kind": "inference_engine",
            "tool": f"cbbench-{engine}",
            "tool_version": str(run.cbbench_version or "unknown"),
            "role": "replica",
            "replicas": dp,
            "model": {"name": str(c.model or "unknown")},
            "accelerator": {
                "model": str(accelerator),
                "count": tp * dp,
                "parallelism": {"tp": tp, "dp": dp, "dp_local": dp, "workers": 1},
            },
        },
        "native": native,
    }


def _load(c: Config, config: dict, done: list[Request], summary: Summary) -> dict:
    workload = str(c.workload or "")
    known = workload and workload != UNKNOWN_WORKLOAD
    source = "random" if workload in RANDOM_WORKLOADS else ("sampled" if known else "unknown")
    rate = c.request_rate
    concurrency = c.max_concurrency
    standardized = {
        "tool": TOOL,
        # The config's own version where a producer wrote one there (none does today).
        "tool_version": str((c.model_extra or {}).get("cbbench_version") or _version()),
        "source": source,
        "input_seq_len": _seq_len(R.values(done, lambda r: r.prompt_tokens),
                                  _mean_length(summary, summary.total_input_tokens)),
        "output_seq_len": _seq_len(R.values(done, lambda r: r.output_tokens),
                                   _mean_length(summary, summary.total_output_tokens)),
        "rate_qps": rate if is_finite(rate) and rate > 0 else None,
        "concurrency": concurrency if isinstance(concurrency, int) and concurrency >= 1 else None,
        "parallelism": _parallelism(c.workers),
    }
    # A multi-turn run keeps its session plan in the config and by_turn in the summary, so a
    # --summary-only file (no requests to read turns from) says so too.
    if c.sessions or summary.by_turn or any(r.turn is not None for r in done):
        standardized["multi_turn"] = {"enabled": True}
    return {
        "metadata": {"cfg_id": _digest(config)[:UID_LENGTH],
                     "description": f"cbbench workload {workload}" if workload else None},
        "standardized": standardized,
        "native": {"args": {"command": c.command} if c.command else None},
    }


def _parallelism(workers) -> int:
    match workers:
        case {"count": count}:  # {"count": N, ...}: a worker plan as distributed/ writes it
            workers = count
        case dict():
            workers = None
    return workers if isinstance(workers, int) and workers >= 1 else 1


def _parallel_size(v) -> int:
    """A parallel size as the result holds it; 1 for one that is not a finite number >= 1
    (inf raised OverflowError, NaN ValueError)."""
    return int(v) if is_finite(v) and v >= 1 else 1


def _mean_length(summary: Summary, total) -> float | None:
    """A --summary-only result's mean length: the summary's token total over the completed
    requests it counts (llm-d's own fallback for vLLM bench: total_input_tokens / completed);
    None where it has no completed request."""
    n = summary.completed
    return total / n if isinstance(n, int) and n > 0 and is_finite(total) else None


def _seq_len(values: np.ndarray, mean: float | None = None) -> dict:
    if values.size == 0:  # no records: the summary's mean where it has one
        return {"distribution": "other", "value": mean if mean is not None else 0}
    lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        return {"distribution": "fixed", "value": lo}
    return {"distribution": "other", "value": float(values.mean()),
            "std_dev": float(values.std()), "min": lo, "max": max(hi, 1)}


def _requests(summary: Summary, requests: list[Request], done: list[Request]) -> dict:
    failed, incomplete = summary.failed, summary.cancelled
    if isinstance(failed, int):  # those the run's end cut, moved from failed to incomplete
        cut = min((summary.error_types or {}).get(INTERRUPTED, 0), failed)
        failed -= cut
        incomplete = (incomplete if isinstance(incomplete, int) else 0) + cut or incomplete
    return {
        # A --summary-only result: every request it counted, the failed and cancelled too.
        "total": len(requests) if requests else sum(
            n for n in (summary.completed, failed, incomplete) if isinstance(n, int)
        ),
        "failures": failed if isinstance(failed, int) else None,
        # Cancelled by the client on purpose (--cancel-rate), or cut by the run's end: neither
        # completed nor failed.
        "incomplete": incomplete if isinstance(incomplete, int) else None,
        "input_length": statistics(R.values(done, lambda r: r.prompt_tokens), "count")
        or _mean_only(_mean_length(summary, summary.total_input_tokens), "count"),
        "output_length": statistics(R.values(done, lambda r: r.output_tokens), "count")
        or _mean_only(_mean_length(summary, summary.total_output_tokens), "count"),
    }


def _latency(summary: Summary, done: list[Request]) -> dict:
    """TTFT, E2EL and NTPOT count from the intended start in an open loop (the result's own
    figures), and from the send under a --max-concurrency cap (the result holds
    ``summary.from_send``): the basis of every source llm-d converts, whose latencies start
    after the concurrency semaphore (vLLM's mean_ttft_ms / mean_e2el_ms), so a closed loop's
    wait for a slot is not reported as the server's latency."""
    itl = _itl_values(done)
    from_send = summary.from_send
    if from_send is not None and not is_empty(from_send):
        ttft, e2el = R.ttft_from_send_ms, R.e2el_from_send_ms
        ttft_dist, e2el_dist = from_send.ttft_ms, from_send.e2el_ms
    else:
        ttft, e2el = (lambda r: r.ttft_ms), (lambda r: r.e2el_ms)
        ttft_dist, e2el_dist = summary.ttft_ms, summary.e2el_ms
    return {
        "time_to_first_token": statistics(R.values(done, ttft), "ms", ttft_dist),
        "time_per_output_token": statistics(R.values(done, lambda r: r.tpot_ms), "ms/token",
                                            summary.tpot_ms),
        "normalized_time_per_output_token": statistics(R.normalized_tpot_ms(done, e2el),
                                                       "ms/token"),
        "inter_token_latency": statistics(itl, "ms/token", summary.itl_ms),
        "request_latency": statistics(R.values(done, e2el), "ms", e2el_dist),
    }


def _itl_values(done: list[Request]) -> np.ndarray:
    """Every request's per-token gaps, pooled. A gap that is not a number (NaN or null in a
    hand-edited or damaged file) is refused with the request named: BR0.2's statistics would
    have to leave it out or be NaN, and either would misreport the run."""
    for r in done:
        for v in r.itl_ms or []:
            if not is_finite(v):
                raise UsageError(f"request {r.id}: itl_ms holds {v}, not a finite number of "
                                 "milliseconds: BR0.2 cannot write its statistics")
    gaps = [v for r in done if r.itl_ms is not None for v in r.itl_ms]
    return np.asarray(gaps, dtype=np.float64)


def _throughput(summary: Summary) -> dict:
    duration = summary.duration_s
    in_tokens = summary.total_input_tokens
    input_rate = in_tokens / duration if is_finite(duration) and duration > 0 and is_finite(in_tokens) else None
    return {
        "input_token_rate": _mean_only(input_rate, "tokens/s"),
        "output_token_rate": _mean_only(summary.output_throughput, "tokens/s"),
        "total_token_rate": _mean_only(summary.total_token_throughput, "tokens/s"),
        "request_rate": _mean_only(summary.request_throughput, "queries/s"),
    }


def statistics(values: np.ndarray, units: str, dist: Distribution | None = None) -> dict | None:
    """The schema's Statistics: from the values when there are any, else from a summary
    distribution (mean, std and the percentiles it holds), else None (left out)."""
    if values.size:
        pct = np.percentile(values, list(PERCENTILE_KEYS.values()))
        return {
            "units": units,
            "mean": float(values.mean()),
            "stddev": float(values.std()),
            "min": float(values.min()),
            **{k: float(v) for k, v in zip(PERCENTILE_KEYS, pct)},
            "max": float(values.max()),
        }
    if dist is None or not is_finite(mean := dist.mean):
        return None
    out = {"units": units, "mean": mean}
    if is_finite(std := dist.std):
        out["stddev"] = std
    pnn = dist.model_extra or {}  # the pNN keys: extra fields of the distribution
    for key, p in PERCENTILE_KEYS.items():
        v = pnn.get(f"p{p:g}")
        if is_finite(v):
            out[key] = v
    return out


def _mean_only(value, units: str) -> dict | None:
    return {"units": units, "mean": value} if is_finite(value) else None




def _parse_time(text) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _digest(obj) -> str:
    raw = json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def _drop_none(obj):
    """Optional fields the result has no value for are left out, not written as null (the
    native configuration is kept as the result has it)."""
    if isinstance(obj, dict):
        return {
            k: (v if k == "native" else _drop_none(v)) for k, v in obj.items() if v is not None
        }
    if isinstance(obj, list):
        return [_drop_none(v) for v in obj]
    return obj


def _version() -> str:
    from cbbench import __version__

    return __version__
