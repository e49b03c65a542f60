"""Issue 36: the run table reads the result's models by attribute. The text it prints is the
text the dict-reading table printed: tests/data/results/run_tables.txt was written by the table
before the change, for runs with every optional section (reasoning rows, the from-send rows,
client-bound marks, the event gap, the TTFT/E2EL split, slices, turns and sessions, the server's
histograms, workers, the engine, KV transfers, speculative decoding, telemetry, an interrupted
run; an endpoint run with images, payloads and inputs; a run with no steady window).

Regenerate (only when a change of the printed table is intended, and say so in the commit):
``python tests/analysis/test_summary_table_models.py --write``.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from cbbench.analysis.table import render_summary
from cbbench.schema import RunResult, to_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "results"
EXPECTED = DATA / "run_tables.txt"
SEPARATOR = "\n=====\n"


def _dist(scale: float, count: int = 10) -> dict:
    return {"mean": 1.5 * scale, "std": 0.25 * scale, "p50": 1.25 * scale, "p90": 2.0 * scale,
            "p95": 2.5 * scale, "p99": 3.0 * scale, "count": count}


def _part(scale: float, share: float | None) -> dict:
    return {**_dist(scale), "share": share}


def _base() -> dict:
    run = json.loads((DATA / "run.json").read_text())
    for key in ("requests", "iterations"):
        run.pop(key)
    run["telemetry"].pop("samples")
    return run


def _engine_run() -> dict:
    """An engine run with every optional section the table shows."""
    run = _base()
    run["interrupted"] = True
    cfg = run["config"]
    cfg.update(label="full", data_parallel_size=2, router="prefix-aware",
               tensor_parallel_size=2, disaggregate="1:1", kv_link="nvlink",
               request_rate=4.0, percentiles=[50, 90, 99, 99.9])
    s = run["summary"]
    s["cancelled"] = 2
    for key in ("ttft_ms", "itl_ms", "event_gap_ms", "ttfot_ms", "reasoning_time_ms",
                "reasoning_tokens", "reasoning_share", "tokens_per_event"):
        s[key] = {**_dist(2.0), "p99.9": 7.0}
    s["tokens_per_event"]["mean"] = 2.5
    s["reasoning_tokens"]["p99"] = 120  # an int: the table shows it as one
    s["client_bound"] = {"metrics": ["ttft_ms", "itl_ms"],
                         "reasons": ["the loop lagged.", "the client fell behind."]}
    s["latency_basis"] = "intended_start"
    s["slot_wait_ms"] = {**_dist(4.0), "p99.9": 9.0}
    s["from_send"] = {"ttft_ms": {**_dist(3.0), "p99.9": 8.0}, "e2el_ms": _dist(5.0)}
    s["short_outputs"]["count"] = 2
    s["short_outputs"]["mean_shortfall"] = 3.5
    s["server_prefix_cache"] = {"requests": 4, "cached_tokens": 1200, "prompt_tokens": 4800,
                                "hit_rate": 0.25}
    parts = {"slot_wait_ms": _part(1.0, 0.1), "send_lag_ms": _part(0.1, None),
             "network_in_ms": _part(0.5, 0.05), "server_queue_ms": _part(2.0, 0.2),
             "server_prefill_ms": _part(6.0, 0.65)}
    s["ttft_breakdown"] = {"requests": 6, "flagged": 1, "tolerance_ms": 0.5,
                           "sources": ["server_timing"], **parts}
    s["e2el_breakdown"] = {"requests": 5, "flagged": 0, "tolerance_ms": 1.0,
                           "sources": ["server_timing", "headers"],
                           "network_ms": _part(1.0, 0.01), "server_decode_ms": _part(50, 0.9),
                           "delivery_ms": _part(0.2, 0.09)}
    s["slices"] = [{**s["slices"][0], "start_s": i * 0.5, "end_s": (i + 1) * 0.5}
                   for i in range(14)]
    s["by_turn"] = [{"turn": k, "completed": 10 - k % 3, "failed": 0,
                     "mean_prompt_tokens": 100.0 * k if k != 2 else None,
                     "ttft_ms": _dist(k), "tpot_ms": _dist(0.5 * k),
                     "server_prefix_cache": None} for k in range(1, 11)]
    s["sessions"] = {"count": 10, "started": 10, "completed": 8, "ended_early": 1,
                     "turns_planned": 100, "turns_sent": 95, "duration_s": _dist(10.0),
                     "mean_ttft_ms": _dist(1.0), "time_in_tools_s": _dist(2.0),
                     "time_in_model_s": _dist(6.0),
                     "time_in_subagents_s": {**_dist(1.0), "p50": None},
                     "ttft_by_turn_kind_ms": {}}
    s["http"] = {"server_latency": {
        "ttft_ms": {"histogram": "vllm:time_to_first_token_seconds", "observations": 6,
                    "server_p50": 20.0, "server_p50_bucket": [10.0, 25.0],
                    "client_within_bucket": True, "server_mean": 19.0, "client_p50": 21.5,
                    "diff_p50": 1.5, "client_mean": 20.0, "diff_mean": 1.0},
        "itl_ms": {"histogram": "vllm:inter_token_latency_seconds", "observations": 90,
                   "server_p50": 4.0, "server_p50_bucket": [2.5, 5.0],
                   "client_within_bucket": False, "server_mean": 4.1, "client_p50": 6.0,
                   "diff_p50": 2.0, "client_mean": 6.1, "diff_mean": 2.0},
        "e2el_ms": {"histogram": "vllm:e2e_request_latency_seconds", "observations": 6,
                    "server_p50": 70.0, "server_p50_bucket": [50.0, None],
                    "client_within_bucket": False, "server_mean": None, "client_p50": 73.0,
                    "diff_p50": 3.0, "client_mean": 73.5}}}  # diff_mean: an older file
    worker = {"worker": 0, "status": "done", "pid": 11, "host": "node-a", "assigned": 4,
              "sent": 4, "completed": 3, "failed": 0, "cancelled": 1, "lost": 0,
              "not_sent": 0, "send_lag_p50_ms": 0.5, "send_lag_p99_ms": 2.25,
              "client_fell_behind": False, "loop_lag_p50_ms": 0.1, "loop_lag_p99_ms": 1.5,
              "client_bound": False, "client_cpu_s": 0.2, "client_cpu_util": 0.125,
              "max_in_flight": 4, "duration_s": 1.0, "clock_uncertainty_ms": 0.0125}
    s["workers"] = [worker, {**worker, "worker": 1, "status": "died", "host": None,
                             "cancelled": 0, "not_sent": 2, "send_lag_p50_ms": None,
                             "client_cpu_util": None, "clock_uncertainty_ms": None}]
    s["engine"]["prefix_cache_hit_rate"] = 0.375
    s["kv_transfer_ms"] = _dist(0.75, count=6)
    s["speculative"] = {"draft_tokens": 40, "accepted_tokens": 30, "num_drafts": 10,
                        "acceptance_rate": 0.75, "mean_acceptance_length": 4.0,
                        "source": "engine", "speculative_tokens": 4}
    tel = run["telemetry"]
    tel.update(available=True, reason=None, metric="dram_active_dcgm")
    tel["summary"]["steady"]["dram_bw_util_pct"] = {"mean": 61.25, "p50": 60.0, "p90": 75.5}
    tel["summary"]["steady"]["sm_util_pct"] = {"mean": 88.0, "p50": 90.0, "p90": 95.0}
    return run


def _endpoint_run() -> dict:
    """An endpoint run: embeddings inputs, images and payloads, several endpoints."""
    run = _base()
    run["telemetry"].update(available=False, reason="no GPU to sample (an endpoint run)")
    cfg = run["config"]
    for key in ("engine", "model", "gpu", "scheduler", "chunked_prefill"):
        cfg.pop(key)
    cfg.update(target="http", served_model="my-model", api="embeddings",
               endpoints=["http://a:8000", "http://b:8000"], balance="round-robin",
               request_rate="inf", sessions={"sessions": 3}, num_requests=3)
    s = run["summary"]
    for key in ("engine", "slices", "short_outputs", "goodput", "slo_attainment"):
        s.pop(key)
    s["input_throughput"] = 1234.5
    s["inputs"] = 4096
    s["images"] = {"requests": 3, "images": 12, "image_tokens": 3000, "text_tokens": 1500}
    s["request_bytes"] = _dist(2048.0)
    s["steady_state"]["level"] = None
    s["steady_state"]["method"] = "in_flight_requests"
    s["steady_state"].pop("note")
    s["speculative"] = {"acceptance_rate": None, "mean_acceptance_length": None,
                        "source": "server"}
    s["workers"] = [{"worker": 0, "status": "done", "host": None, "sent": 3, "completed": 3,
                     "failed": 0, "cancelled": 0, "not_sent": 0}]
    s["by_turn"] = [{"turn": 1, "completed": 3, "failed": 0, "mean_prompt_tokens": 12.0,
                     "ttft_ms": _dist(1.0), "tpot_ms": _dist(1.0)}]
    s["sessions"] = {"count": 3, "completed": 3, "turns_planned": 3, "turns_sent": 3,
                     "duration_s": _dist(1.0), "time_in_tools_s": {"p50": None}}
    return run


def _quiet_run() -> dict:
    """No steady window, images without a token split, a replayed run from one endpoint."""
    run = _base()
    run["telemetry"] = {"available": False, "reason": "simulated engine"}
    cfg = run["config"]
    cfg.update(target="http", model=None, endpoint="http://c:8000", replay="trace.jsonl",
               percentiles=[50, 90, 95, 99])
    s = run["summary"]
    s["steady_state"] = {"window_s": None, "method": "warmup_cooldown",
                         "note": "empty window: --warmup/--cooldown leave nothing"}
    s["images"] = {"requests": 2, "images": 2, "image_tokens": None}
    s["request_bytes"] = {"mean": None}
    s["server_prefix_cache"] = {"requests": 0, "cached_tokens": 0, "prompt_tokens": 0,
                                "hit_rate": None}
    s["engine"] = {"num_iterations": 0}
    s["kv_transfer_ms"] = {"count": 0}
    s["client_bound"] = {"metrics": [], "reasons": []}
    return run


RUNS = {"engine": _engine_run, "endpoint": _endpoint_run, "quiet": _quiet_run}


def _expected() -> dict[str, str]:
    texts = EXPECTED.read_text().split(SEPARATOR)
    return dict(zip(RUNS, texts, strict=True))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_table_from_the_model_is_the_table_the_dict_gave(name):
    run = RUNS[name]()
    model = RunResult.model_validate(copy.deepcopy(run))
    assert to_dict(model) == run  # the model holds the file, as written
    assert render_summary(model) == _expected()[name]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_dict_still_renders_the_same_table(name):
    """Callers (and tests) that hold the file's dict get the same text."""
    assert render_summary(RUNS[name]()) == _expected()[name]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    EXPECTED.write_text(SEPARATOR.join(render_summary(build()) for build in RUNS.values()))
