"""`cbbench serve`'s own side of the story: vLLM-named latency metrics in /metrics, and the
--request-log file, both checked against cbbench's HTTP client request for request.

The server runs in-process (uvicorn in a thread, sim engine on the wall clock), so the client's
and the server's times come from one perf_counter: a request's client-side interval (intended
start -> first token read) must contain the server's (arrival -> first token made).
Every network loop here is bounded in count and time.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from helpers import SERVE_MODEL as MODEL
from helpers import invoke_app, sim_options, start_server
from prometheus_client.parser import text_string_to_metric_families

from cbbench.cli.serve import build_serving_engine
from cbbench.load.workload_types import WorkloadRequest
from cbbench.server.app import ServeConfig
from cbbench.targets.http import EndpointOptions, run_http

N = 16
GAP_S = 0.015  # between arrivals: a few requests overlap in the engine
LOG_WAIT_S = 5.0
POLL_S = 0.02
# Epoch times are rounded to the microsecond: a difference of two may be off by one.
ROUNDING_S = 2e-6

# vLLM's buckets (vllm/v1/metrics/loggers.py), written out here as the oracle.
VLLM_TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]
VLLM_ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
]
VLLM_REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]
# One observation per finished request.
PER_REQUEST_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_max_tokens",
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "requests.jsonl"
    run = start_server(
        lambda: build_serving_engine(sim_options()), ServeConfig(request_log=str(log))
    )
    yield run, log
    run.stop()


@pytest.fixture(scope="module")
def client_run(served):
    """N requests from cbbench's own client. Lengths repeat (four prompt lengths, three output
    lengths), so only the response id can pair a record with its log line."""
    run, _ = served
    wreqs = [
        WorkloadRequest(id=i, prompt_len=10 + 3 * (i % 4), output_len=4 + i % 3) for i in range(N)
    ]
    arrivals = np.arange(N) * GAP_S
    res = run_http(EndpointOptions(endpoint=run.url), wreqs, arrivals)
    assert all(r.ok for r in res.records), [r.error for r in res.records]
    return res


def read_log(path, n: int) -> list[dict]:
    deadline = time.monotonic() + LOG_WAIT_S
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            break
        time.sleep(POLL_S)
    return [json.loads(x) for x in lines]


def scrape(url: str) -> dict[str, dict]:
    """name -> {"type", "samples": [(sample name, labels, value)]}."""
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return {
        f.name: {"type": f.type, "samples": [(s.name, s.labels, s.value) for s in f.samples]}
        for f in text_string_to_metric_families(text)
    }


def sample(fams: dict, family: str, suffix: str = "", **labels) -> float:
    for name, lab, value in fams[family]["samples"]:
        if name == family + suffix and all(lab.get(k) == v for k, v in labels.items()):
            return value
    raise AssertionError(f"{family}{suffix} {labels} not exposed")


def buckets(fams: dict, family: str) -> list[float]:
    return [
        float(lab["le"]) for name, lab, _ in fams[family]["samples"]
        if name == family + "_bucket" and lab["le"] != "+Inf"
    ]


# ---- /metrics ------------------------------------------------------------------------------------
def test_vllm_histograms_count_every_request(served, client_run):
    run, log_path = served
    recs = client_run.records
    fams = scrape(run.url)
    model = {"model_name": MODEL, "engine": "0"}
    for name in PER_REQUEST_HISTOGRAMS:
        assert fams[name]["type"] == "histogram", name
        assert sample(fams, name, "_count", **model) == N, name
        assert sample(fams, name, "_bucket", le="+Inf", **model) == N, name
    outputs = sum(r.output_tokens for r in recs)
    assert sample(fams, "vllm:inter_token_latency_seconds", "_count", **model) == outputs - N
    assert sample(fams, "vllm:time_per_output_token_seconds", "_count", **model) == outputs - N
    assert sample(fams, "vllm:generation_tokens", "_total", **model) == outputs
    prompts = sum(r.server_prompt_tokens for r in recs)
    assert sample(fams, "vllm:prompt_tokens", "_total", **model) == prompts
    assert sample(fams, "vllm:request_success", "_total", finished_reason="length", **model) == N
    assert sample(fams, "vllm:num_preemptions", "_total", **model) == 0
    assert sample(fams, "vllm:num_requests_running", **model) == 0
    assert buckets(fams, "vllm:time_to_first_token_seconds") == VLLM_TTFT_BUCKETS
    assert buckets(fams, "vllm:inter_token_latency_seconds") == VLLM_ITL_BUCKETS
    assert buckets(fams, "vllm:e2e_request_latency_seconds") == VLLM_REQUEST_LATENCY_BUCKETS
    assert buckets(fams, "vllm:request_queue_time_seconds") == VLLM_REQUEST_LATENCY_BUCKETS
    # cbbench's own iteration metrics stay beside them.
    assert sample(fams, "cbbench_requests_finished", "_total") == N
    assert "cbbench_iteration_duration_seconds" in fams

    # The histograms and the request log tell the same story: TTFT and e2e count from the
    # request's hand-over to the engine.
    log = read_log(log_path, N)
    ttft_sum = sum(e["first_token"] - e["submitted"] for e in log)
    e2e_sum = sum(e["last_token"] - e["submitted"] for e in log)
    assert sample(fams, "vllm:time_to_first_token_seconds", "_sum", **model) == pytest.approx(
        ttft_sum, abs=N * ROUNDING_S
    )
    assert sample(fams, "vllm:e2e_request_latency_seconds", "_sum", **model) == pytest.approx(
        e2e_sum, abs=N * ROUNDING_S
    )
    # Queue time starts where vLLM's QUEUED event does: the scheduler taking the request in
    # (the log's admitted), not its arrival while a step was in flight.
    queue_sum = sum(e["queue_exit"] - e["admitted"] for e in log)
    assert sample(fams, "vllm:request_queue_time_seconds", "_sum", **model) == pytest.approx(
        queue_sum, abs=N * ROUNDING_S
    )


# ---- --request-log -------------------------------------------------------------------------------
def test_request_log_matches_the_client_request_for_request(served, client_run):
    """Joined by the response id the client recorded: one log line per record, the same token
    counts, and the client's TTFT (from its send) contains the server's, request by request."""
    _, log_path = served
    log = read_log(log_path, N)
    assert len(log) == N
    by_id = {e["id"]: e for e in log}
    recs = client_run.records
    assert len(by_id) == N and sorted(r.server_request_id for r in recs) == sorted(by_id)
    for rec in recs:
        e = by_id[rec.server_request_id]
        # (the server's prompt count, not the workload's: without a tokenizer the client's
        # synthetic prompts are approximate in length)
        assert e["prompt_tokens"] == rec.server_prompt_tokens
        assert e["output_tokens"] == rec.output_tokens == rec.max_tokens
        assert e["finish"] == "length" and e["status"] == 200 and e["api"] == "completions"
        assert e["id"].startswith("cmpl-") and isinstance(e["engine_id"], int)
        t = [e[k] for k in (
            "arrival", "submitted", "admitted", "queue_exit", "first_token", "first_token_sent",
        )]
        assert t == sorted(t), e
        assert e["first_token"] <= e["last_token"] <= e["last_token_sent"]
        # The client's TTFT from its send (its TTFT less its send lag) contains the server's
        # widest one (the app's arrival -> first token made): the client sent before the server
        # saw the request and read the token after the engine made it. Only the log's
        # microsecond rounding may cut into it.
        server_ttft = e["first_token"] - e["arrival"]
        assert rec.ttft_from_send_s - server_ttft >= -ROUNDING_S, (
            rec.id, rec.ttft_from_send_s, server_ttft
        )
        assert rec.e2el_from_send_s - (e["last_token"] - e["arrival"]) >= -ROUNDING_S
    # The epoch clock: within a minute of now (generous for a slow machine).
    assert abs(max(e["last_token_sent"] for e in log) - time.time()) < 60


def test_request_log_ids_are_the_ids_the_client_sees(served):
    run, log_path = served
    before = len(read_log(log_path, 0))
    with httpx.Client(base_url=run.url, timeout=30.0) as c:
        body = c.post("/v1/completions", json={"prompt": "a b", "max_tokens": 3}).json()
        seen = [body["id"]]
        req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
        with c.stream("POST", "/v1/chat/completions", json=req) as r:
            ids = {json.loads(x[6:])["id"] for x in r.iter_lines() if x.startswith("data: {")}
        assert len(ids) == 1
        seen.append(ids.pop())
        r = c.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 2},
            headers={"X-Request-Id": "bench-7"},
        )
        assert r.json()["id"] == "cmpl-bench-7"  # vLLM's form: prefix and the client's id
        seen.append("cmpl-bench-7")
    new = read_log(log_path, before + 3)[before:]
    assert [e["id"] for e in new] == seen
    assert [(e["api"], e["stream"], e["output_tokens"]) for e in new] == [
        ("completions", False, 3), ("chat", True, 2), ("completions", False, 2),
    ]
    assert new[0]["first_token_sent"] == new[0]["last_token_sent"]  # one body


def test_request_log_records_rejections_and_hang_ups(served):
    run, log_path = served
    before = len(read_log(log_path, 0))
    with httpx.Client(base_url=run.url, timeout=30.0) as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 10**6})
        assert r.status_code == 400
        req = {"prompt": "p", "max_tokens": 3000, "stream": True}
        with c.stream("POST", "/v1/completions", json=req) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 6:
                    break
    new = read_log(log_path, before + 2)[before:]
    assert [(e["finish"], e["status"]) for e in new] == [("rejected", 400), ("abort", 200)]
    assert "context" in new[0]["error"] and new[0]["first_token"] is None
    assert 0 < new[1]["output_tokens"] < 3000


# ---- cbbench run --scrape-metrics against cbbench serve ------------------------------------------
def test_run_scrape_metrics_reads_cbbench_serve_as_vllm(served, tmp_path, monkeypatch):
    """The client's scraper reads `cbbench serve` as it reads vLLM: the server's TTFT, TPOT,
    ITL and e2e beside the client's (from the vLLM histograms), and over the run the vLLM-named
    counters grow by exactly what the client's records add up to."""
    import sys

    from cbbench.schema import read_run, to_dict

    run, _ = served
    n = 8
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(
        json.dumps({"prompt_len": 12 + i, "output_len": 5 + i}) + "\n" for i in range(n)
    ))
    model = {"model_name": MODEL, "engine": "0"}
    before = scrape(run.url)
    out = tmp_path / "result.json"
    args = [
        "run", "--endpoint", run.url, "--workload", str(workload), "--num-requests", str(n),
        "--request-rate", "40", "--scrape-metrics", "--output", str(out),
    ]
    monkeypatch.setattr(sys, "argv", ["cbbench", *args])
    r = invoke_app(args)
    assert r.exit_code == 0, r.output
    res = to_dict(read_run(out))
    rows = res["server_metrics"]

    def growth(name: str, **labels) -> float:
        vals = [
            x["value"] for x in sorted(rows, key=lambda x: x["t_s"])
            if x["name"] == name and all(x["labels"].get(k) == v for k, v in labels.items())
        ]
        assert vals, f"{name} {labels} was not scraped"
        family = name.removesuffix("_total")
        return vals[-1] - sample(before, family, "_total", **labels)

    reqs = res["requests"]
    # The result keeps each request's server id: the handle on the server's own log line.
    ids = [q["server_request_id"] for q in reqs]
    assert len(set(ids)) == n and all(i.startswith("cmpl-") for i in ids)
    # The client's summary has the server's own latencies, from the vLLM histograms.
    lat = res["summary"]["http"]["server_latency"]
    outputs = sum(q["output_tokens"] for q in reqs)
    assert {k: lat[k]["observations"] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")} == {
        "ttft_ms": n, "tpot_ms": n, "e2el_ms": n, "itl_ms": outputs - n,
    }
    assert lat["ttft_ms"]["histogram"] == "vllm:time_to_first_token_seconds"
    # Every client TTFT (from its send) contains the server's: so does their mean (exact on
    # the server's side), and the client's p50 is not below the bucket of the server's.
    client_ttft = [q["ttft_ms"] - q["send_lag_ms"] for q in reqs]
    assert lat["ttft_ms"]["server_mean"] <= sum(client_ttft) / n
    assert lat["ttft_ms"]["client_p50"] >= lat["ttft_ms"]["server_p50_bucket"][0]
    assert lat["ttft_ms"]["diff_p50"] is not None
    assert lat["ttft_ms"]["diff_mean"] == pytest.approx(
        sum(client_ttft) / n - lat["ttft_ms"]["server_mean"]
    )
    assert lat["ttft_ms"]["diff_mean"] >= 0
    assert growth("vllm:request_success_total", finished_reason="length", **model) == n
    assert growth("vllm:generation_tokens_total", **model) == outputs
    assert growth("vllm:prompt_tokens_total", **model) == sum(
        q["server_prompt_tokens"] for q in reqs
    )


# ---- preemptions: the log and the vLLM counter ---------------------------------------------------
TIGHT_KV_BLOCKS = 16  # 256 tokens: four requests of ~100 tokens each cannot all stay resident


def test_preemptions_in_the_log_add_up_to_the_vllm_counter(tmp_path):
    """A pool too small for the requests in flight: the scheduler preempts, every request still
    finishes whole, and the request log's per-request preemptions add up to
    vllm:num_preemptions_total (issue 18: preemptions in /metrics and in the log)."""
    log_path = tmp_path / "requests.jsonl"
    run = start_server(
        lambda: build_serving_engine(sim_options(num_kv_blocks=TIGHT_KV_BLOCKS)),
        ServeConfig(request_log=str(log_path)),
    )
    try:
        n, out_len = 4, 60
        wreqs = [WorkloadRequest(id=i, prompt_len=40, output_len=out_len) for i in range(n)]
        res = run_http(
            EndpointOptions(endpoint=run.url), wreqs, np.zeros(n)
        )
        assert all(r.ok and r.output_tokens == out_len for r in res.records), [
            r.error for r in res.records
        ]
        fams = scrape(run.url)
    finally:
        run.stop()
    log = read_log(log_path, n)
    assert len(log) == n and all(e["finish"] == "length" for e in log)
    by_id = {e["id"]: e for e in log}
    assert {r.server_request_id for r in res.records} == set(by_id)
    preempted = sum(e["preemptions"] for e in log)
    assert preempted > 0  # the pool was tight enough to force some
    model = {"model_name": MODEL, "engine": "0"}
    assert sample(fams, "vllm:num_preemptions", "_total", **model) == preempted
    assert all(e["output_tokens"] == out_len for e in log)
