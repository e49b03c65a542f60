"""One benchmark run, target-agnostic: workload -> arrival schedule -> target -> result dict."""

from __future__ import annotations

import datetime as _dt
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .arrivals import arrival_times, resolve_process
from .engine_target import EngineOptions, run_engine
from .metrics import summarize, summarize_engine
from .result import base_result
from .workload import load_workload, sample_requests

DEFAULT_NUM_REQUESTS = 1000


@dataclass
class RunSpec:
    workload: str = "sharegpt"
    num_requests: int | None = DEFAULT_NUM_REQUESTS
    seed: int = 0
    request_rate: float = math.inf
    rate_given: bool = False
    burstiness: float = 1.0
    arrival: str = "auto"
    slo: dict = field(default_factory=dict)
    save_detailed: bool = False
    label: str | None = None
    engine: EngineOptions = field(default_factory=EngineOptions)


def request_record_dict(rec, detailed: bool) -> dict:
    ms = 1000.0
    d = {
        "id": rec.id,
        "prompt_tokens": rec.prompt_tokens,
        "output_tokens": rec.output_tokens,
        "ttft_ms": rec.ttft_s * ms if rec.ttft_s is not None else None,
        "tpot_ms": rec.tpot_s * ms if rec.tpot_s is not None else None,
        "e2el_ms": rec.e2el_s * ms if rec.e2el_s is not None else None,
        "error": rec.error,
        "error_type": rec.error_type,
        "intended_start_s": rec.intended_start_s,
        "send_lag_ms": (rec.send_s - rec.intended_start_s) * ms if rec.send_s is not None else None,
        "num_preemptions": rec.num_preemptions,
        "priority": rec.priority,
    }
    if rec.first_scheduled_s is not None:
        d["queue_ms"] = (rec.first_scheduled_s - rec.intended_start_s) * ms
    if rec.server_prompt_tokens is not None:
        d["server_prompt_tokens"] = rec.server_prompt_tokens
    if detailed:
        t = rec.token_times_s
        d["token_times_s"] = list(t)
        d["itl_ms"] = [(b - a) * ms for a, b in zip(t, t[1:])]
        if rec.output_token_ids is not None:
            d["output_token_ids"] = rec.output_token_ids
    return d


def execute_run(
    spec: RunSpec,
    notice: Callable[[str], None],
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    workload = load_workload(spec.workload)
    num_requests = spec.num_requests
    if num_requests is None and not workload.has_arrivals:
        num_requests = DEFAULT_NUM_REQUESTS  # a timed trace without the flag replays whole
    wreqs, replaced = sample_requests(workload, num_requests, spec.seed)
    if replaced:
        notice(
            f"the workload has {len(workload.requests)} requests; drew {num_requests} "
            "with replacement"
        )
    process = resolve_process(spec.arrival, spec.request_rate, workload.has_arrivals, spec.rate_given)
    arrivals = arrival_times(wreqs, spec.request_rate, spec.burstiness, process, spec.seed)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    run = run_engine(
        spec.engine,
        wreqs,
        arrivals,
        notice,
        should_stop=should_stop,
        on_progress=on_progress,
        keep_token_ids=spec.save_detailed,
    )
    config = {
        "label": spec.label,
        "workload": workload.name,
        "num_requests": len(wreqs),
        "seed": spec.seed,
        # JSON has no infinity: "inf" is written as the string the CLI takes.
        "request_rate": "inf" if math.isinf(spec.request_rate) else spec.request_rate,
        "burstiness": spec.burstiness,
        "arrival": process,
        "slo": spec.slo,
        "target": "engine",
        **{f"engine_{k}" if k == "seed" else k: v for k, v in spec.engine.to_config().items()},
        "command": " ".join(["cbbench", *sys.argv[1:]]),
    }
    result = base_result(config)
    result["started_at"] = started
    result["interrupted"] = run.interrupted
    summary = summarize(run.records, run.duration_s, spec.slo)
    summary["engine"] = summarize_engine(run.iterations)
    if run.not_sent:
        summary["not_sent"] = run.not_sent
    result["summary"] = summary
    result["requests"] = [request_record_dict(r, spec.save_detailed) for r in run.records]
    result["iterations"] = run.iterations
    return result


def spec_to_dict(spec: RunSpec) -> dict:
    return asdict(spec)
