"""The printed summary says what was run (issue 35, item 5): the endpoint and model of an
endpoint run, the cluster (data-parallel replicas and router, disaggregation), chunked prefill,
arrivals at t=0 and what they mean for TTFT, the KV transfer of a disaggregated run, and the
steady-state window in words; and an embeddings run's steady state streams no output."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.steady_state import window_figures
from cbbench.analysis.table import header_lines, render_summary, steady_state_line
from cbbench.cli.app import app

ENGINE = {"target": "engine", "workload": "sharegpt", "engine": "sim", "model": "llama-3-8b",
          "gpu": "h100", "scheduler": "continuous", "chunked_prefill": True,
          "num_requests": 1000, "request_rate": "inf", "arrival": "gamma", "burstiness": 1.0,
          "data_parallel_size": 1, "tensor_parallel_size": 1, "disaggregate": None,
          "kv_link": "nvlink", "router": "round-robin"}


def test_an_endpoint_runs_header_names_the_endpoint_and_model():
    cfg = {"target": "http", "workload": "sharegpt", "endpoint": "http://10.0.0.5:8000",
           "api": "chat", "served_model": "meta-llama/Llama-3.1-8B-Instruct",
           "num_requests": 100, "request_rate": 8.0, "arrival": "gamma", "burstiness": 1.0}
    title = header_lines(cfg)[0]
    assert "endpoint http://10.0.0.5:8000" in title
    assert "model meta-llama/Llama-3.1-8B-Instruct" in title and "--api chat" in title


def test_the_header_shows_chunked_prefill_replicas_router_and_disaggregation():
    lines = header_lines({**ENGINE, "data_parallel_size": 4, "router": "prefix-aware"})
    assert lines[0].endswith("continuous + chunked prefill")
    assert "cluster: 4 data-parallel replicas, router prefix-aware" in lines
    plain = header_lines({**ENGINE, "chunked_prefill": False})
    assert plain[0].endswith("· continuous") and not any("cluster" in x for x in plain)
    disagg = header_lines({**ENGINE, "disaggregate": "1:1"})
    assert "cluster: disaggregated prefill:decode 1:1 instances, KV over nvlink" in disagg


@pytest.mark.parametrize(("rate", "said"), [
    ("inf", "arrivals: all 1000 requests at t=0 (--request-rate inf): TTFT includes each "
            "request's wait behind the others"),
    (8.0, "arrivals: 1000 requests at 8 req/s (Poisson)"),
])
def test_the_header_says_how_requests_arrive(rate, said):
    assert any(line.startswith(said) for line in header_lines({**ENGINE, "request_rate": rate}))


@pytest.mark.parametrize(("extra", "said"), [
    ({}, "arrivals: 3 requests at the trace's own times (its arrival_s)"),
    ({"time_scale": 0.5}, "arrivals: 3 requests at the trace's own times (its arrival_s x 0.5)"),
])
def test_a_trace_replays_header_says_its_own_times(extra, said):
    """A trace replay said 'all 3 requests at t=0 (--request-rate inf)' while it sent them at
    0, 5 and 10 s: the rate left at its default is not how a trace arrives."""
    cfg = {**ENGINE, "num_requests": 3, "arrival": "trace", **extra}
    assert said in header_lines(cfg)


def test_a_multi_turn_runs_arrivals_count_sessions():
    cfg = {**ENGINE, "num_requests": 40, "request_rate": 2.0, "sessions": {"think_time": "1s"}}
    assert "arrivals: 40 sessions at 2 sessions/s (Poisson)" in header_lines(cfg)


def test_a_disaggregated_run_prints_its_kv_transfer(tmp_path):
    out = tmp_path / "d.json"
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu", "h100", "--disaggregate",
                                   "1:1", "--kv-link", "nvlink", "--workload", "long-prompt",
                                   "--request-rate", "4", "--num-requests", "12",
                                   "--output", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "cluster: disaggregated prefill:decode 1:1 instances, KV over nvlink" in res.output
    assert "KV transfer prefill -> decode over nvlink (ms per request): mean " in res.output
    assert "(12 requests)" in res.output


def test_the_steady_state_line_is_in_words():
    ss = {"window_s": [5.64, 60.96], "method": "running_requests", "level": 113.0,
          "requests": 700, "ttft_ms": {"p50": 1.0, "p99": 2.0}, "tpot_ms": {"p50": 3.0,
          "p99": 4.0}, "output_throughput": 100.0, "total_token_throughput": 300.0}
    line = steady_state_line({"steady_state": ss})
    assert line.startswith("steady state, 5.64-60.96 s of the run (the engine ran a steady ~113 "
                           "requests; ramp-up and drain left out): 700 requests")
    assert "running_requests" not in line and line.endswith("100.0 output tok/s")
    # An embeddings run (its summary has input throughput) shows its input tokens instead.
    pooled = steady_state_line({"steady_state": {**ss, "output_throughput": 0.0},
                                "input_throughput": 200.0})
    assert pooled.endswith("300.0 input tok/s") and "output tok/s" not in pooled


def test_an_embeddings_window_streams_no_output_tokens():
    """An embeddings answer's one time sits in token_times_s: it is not an output token (the
    whole run's output throughput is 0.0; the window said 2.5 tok/s)."""
    recs = []
    for i in range(20):
        r = RequestRecord(id=i, prompt_tokens=50, output_tokens=0, intended_start_s=i * 0.1,
                          send_s=i * 0.1)
        r.token_times_s = [i * 0.1 + 0.05]
        recs.append(r)
    w = window_figures(recs, 0.0, 2.0)
    assert w["completed"] == 20
    assert w["output_throughput"] == 0.0
    assert w["total_token_throughput"] == pytest.approx(20 * 50 / 2.0)


def test_render_summary_puts_the_header_first():
    result = {"config": {**ENGINE, "label": "mine"},
              "summary": {"completed": 1, "failed": 0, "duration_s": 1.0,
                          "request_throughput": 1.0, "output_throughput": 1.0,
                          "total_token_throughput": 2.0}}
    text = render_summary(result)
    assert text.startswith("cbbench · mine · sharegpt · engine sim · llama-3-8b on h100 · "
                           "continuous + chunked prefill\narrivals: all 1000 requests at t=0")
