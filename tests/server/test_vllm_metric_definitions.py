"""`cbbench serve`'s ``vllm:*`` series held to vLLM's own definitions (vllm/v1/metrics/stats.py
IterationStats, loggers.py PrometheusStatLogger), where they differ from a per-token or
per-scheduled-token reading: under speculative decoding a step gives a request several tokens
at once, and a chunked prefill takes steps that give none. The request log's stream events
(one per engine output) are the oracle."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from helpers import SERVE_MODEL as MODEL
from helpers import sim_options, start_server
from prometheus_client.parser import text_string_to_metric_families

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig

N = 4
DRAFTS = 3  # --speculative-tokens
MAX_TOKENS = 12
LOG_WAIT_S = 5.0
POLL_S = 0.02


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if not s.name.endswith("_bucket") and "finished_reason" not in s.labels}


@pytest.fixture(scope="module")
def spec_run(tmp_path_factory):
    log = tmp_path_factory.mktemp("spec") / "requests.jsonl"
    run = start_server(lambda: build_serving_engine(sim_options(speculative_tokens=DRAFTS)),
                       ServeConfig(request_log=str(log)))
    try:
        for i in range(N):
            body = {"model": MODEL, "prompt": "hello world " * (4 + i), "max_tokens": MAX_TOKENS,
                    "ignore_eos": True, "stream": True}
            with httpx.stream("POST", run.url + "/v1/completions", json=body, timeout=30) as r:
                assert r.status_code == 200
                r.read()
        deadline = time.monotonic() + LOG_WAIT_S
        lines: list[str] = []
        while len(lines) < N and time.monotonic() < deadline:
            lines = log.read_text().splitlines()
            time.sleep(POLL_S)
        yield _scrape(run.url), [json.loads(x) for x in lines]
    finally:
        run.stop()


def test_inter_token_latency_is_one_observation_per_engine_output(spec_run):
    # vLLM appends one inter-token latency per request per engine output after the first
    # (stats.py update_from_output), however many tokens that output carries: a step that
    # accepted two drafts is one gap, not three (two of them 0).
    fams, log = spec_run
    outputs = sum(len(e["events"]) for e in log)
    tokens = sum(e["output_tokens"] for e in log)
    assert tokens > outputs  # drafts were accepted: some outputs carried several tokens
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert fams[name + "_count"] == outputs - N, name
        # the gaps cover each request's first to last token, as its decode time does
        assert fams[name + "_sum"] == pytest.approx(
            fams["vllm:request_decode_time_seconds_sum"], rel=1e-9), name


def test_iteration_tokens_are_the_steps_prompt_and_generation_tokens(spec_run):
    # vLLM observes num_prompt_tokens + num_generation_tokens of each iteration (loggers.py):
    # the prompts of the requests that got their first token, and the tokens generated. Draft
    # tokens the verify step rejected are neither; the sums over a run therefore agree.
    fams, _ = spec_run
    assert fams["vllm:iteration_tokens_total_sum"] == (
        fams["vllm:prompt_tokens_total"] + fams["vllm:generation_tokens_total"])


def test_iteration_tokens_observe_only_steps_with_outputs():
    # vLLM makes an IterationStats only for an engine-core batch with outputs (async_llm.py
    # output_handler: `IterationStats() if (log_stats and num_outputs) else None`): a step that
    # only advanced a chunked prefill is no observation. One 300-token prompt in 64-token
    # chunks and 4 output tokens: 4 observations, summing to 300 + 4.
    prompt, out = 300, 4
    run = start_server(lambda: build_serving_engine(sim_options(max_num_batched_tokens=64)))
    try:
        body = {"model": MODEL, "prompt": [7] * prompt, "max_tokens": out, "ignore_eos": True}
        r = httpx.post(run.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == out
        fams = _scrape(run.url)
    finally:
        run.stop()
    assert fams["vllm:iteration_tokens_total_count"] == out
    assert fams["vllm:iteration_tokens_total_sum"] == prompt + out


def _success(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return {s.labels["finished_reason"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "vllm:request_success_total"}


@pytest.fixture(scope="module")
def metrics_run(tmp_path_factory):
    log = tmp_path_factory.mktemp("queue") / "requests.jsonl"
    run = start_server(lambda: build_serving_engine(sim_options()),
                       ServeConfig(request_log=str(log), per_request_metrics=True))
    yield run, log
    run.stop()


def test_one_requests_queue_time_is_one_figure(metrics_run):
    # vLLM's queued interval is QUEUED -> first SCHEDULED (stats.py update_from_finished_request)
    # for the histogram and for the per-request `metrics.queue_time_ms` alike (its
    # build_per_request_timing_metrics reads the same queued_ts and scheduled_ts). Requests
    # sent together reach the engine mid-step, where the arrival and the QUEUED event differ.
    from concurrent.futures import ThreadPoolExecutor

    run, _ = metrics_run

    def one(i: int) -> float:
        body = {"model": MODEL, "prompt": "a b c " * (2 + i), "max_tokens": 4, "ignore_eos": True}
        return httpx.post(run.url + "/v1/completions", json=body,
                          timeout=30).json()["metrics"]["queue_time_ms"]

    with ThreadPoolExecutor(N) as pool:
        queue_ms = list(pool.map(one, range(N)))
    deadline = time.monotonic() + LOG_WAIT_S
    while (fams := _scrape(run.url))["vllm:request_queue_time_seconds_count"] < N:
        assert time.monotonic() < deadline
        time.sleep(POLL_S)
    assert fams["vllm:request_queue_time_seconds_sum"] == pytest.approx(
        sum(queue_ms) / 1000.0, abs=1e-9)


def test_a_client_abort_is_no_success(metrics_run):
    # vLLM's client abort (AsyncLLM.abort -> OutputProcessor.abort_requests) drops the
    # request's state without update_from_finished_request: request_success never sees it.
    # Its finished_reason="abort" series counts only requests the engine itself finished so.
    run, log = metrics_run
    body = {"model": MODEL, "prompt": "p", "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", run.url + "/v1/completions", json=body, timeout=30) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 4:
                break
    deadline = time.monotonic() + LOG_WAIT_S
    while _scrape(run.url)["cbbench_requests_aborted_total"] < 1:  # the engine took the abort
        assert time.monotonic() < deadline
        time.sleep(POLL_S)
    assert _success(run.url)["abort"] == 0


def test_prefix_cache_counters_by_hand():
    # vLLM's vllm:prefix_cache_queries / _hits (loggers.py; kv_cache_manager.py
    # get_computed_blocks): per new request looked up, its tokens and the full cached blocks'
    # tokens (at most num_tokens - 1). Block size 16: A (40 tokens) queries 40, hits 0; B
    # shares A's first 32 tokens: queries 40, hits 32 (two full blocks).
    run = start_server(lambda: build_serving_engine(sim_options(enable_prefix_caching=True)))
    try:
        for prompt in ([7] * 40, [7] * 32 + [9] * 8):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
            assert httpx.post(run.url + "/v1/completions", json=body, timeout=30).status_code == 200
        deadline = time.monotonic() + LOG_WAIT_S
        while (fams := _scrape(run.url))["vllm:e2e_request_latency_seconds_count"] < 2:
            assert time.monotonic() < deadline
            time.sleep(POLL_S)
    finally:
        run.stop()
    assert fams["vllm:prefix_cache_queries_total"] == 80
    assert fams["vllm:prefix_cache_hits_total"] == 32


def test_request_params_n_and_max_generation_tokens_per_finished_request(metrics_run):
    # vLLM observes both once per finished request (parallel_sampling.py
    # observe_finished_request; loggers.py): n (1 for every request here, n > 1 being refused)
    # and the most tokens any of its n samples generated (its own, for n = 1).
    run, _ = metrics_run
    for k in (3, 5):
        body = {"model": MODEL, "prompt": "a b", "max_tokens": k, "ignore_eos": True}
        assert httpx.post(run.url + "/v1/completions", json=body, timeout=30).status_code == 200
    deadline = time.monotonic() + LOG_WAIT_S
    while (fams := _scrape(run.url))["vllm:e2e_request_latency_seconds_count"] < 2:
        assert time.monotonic() < deadline
        time.sleep(POLL_S)
    done = fams["vllm:e2e_request_latency_seconds_count"]
    assert fams["vllm:request_params_n_count"] == fams["vllm:request_params_n_sum"] == done
    assert fams["vllm:request_max_num_generation_tokens_count"] == done
    assert fams["vllm:request_max_num_generation_tokens_sum"] == (
        fams["vllm:request_generation_tokens_sum"])


# ---- a request the engine failed (it serves on) ----------------------------------------------
POISON = 7  # a prompt starting with this id makes the step, or the admission, raise


class _PoisonedExecutor:
    def __init__(self, inner) -> None:
        self.inner = inner

    def execute(self, sched):
        if any(r.prompt_token_ids[:1] == [POISON] for r in sched.scheduled_reqs):
            raise ValueError("Overflow when unpacking long long")
        return self.inner.execute(sched)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _gauges(url: str) -> dict[str, float]:
    fams = _scrape(url)
    return {k: fams[k] for k in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                 "vllm:kv_cache_usage_perc")}


def test_a_request_the_engine_failed_counts_as_error_and_refusals_count_nowhere():
    # vLLM pre-creates a request_success series for every FinishReason (loggers.py: `for reason
    # in FinishReason`), since v0.11.1 stop, length, abort, error and repetition. A request the
    # engine fails while serving on (a KV-load failure, an exception taking it in: engine
    # core's _handle_request_preproc_error) finishes with "error" and is counted under it,
    # answered 500. A request refused before the engine (a 400) is counted nowhere.
    def build():
        engine, info = build_serving_engine(sim_options())
        engine.executor = _PoisonedExecutor(engine.executor)
        reason = engine.scheduler.rejection_reason

        def picky(req):  # the admission raises for a prompt [POISON, POISON, ...]
            if req.prompt_token_ids[:2] == [POISON, POISON]:
                raise OverflowError("int too large to convert")
            return reason(req)

        engine.scheduler.rejection_reason = picky
        return engine, info

    run = start_server(build)
    try:
        assert _success(run.url) == dict.fromkeys(
            ("stop", "length", "abort", "error", "repetition"), 0)
        with httpx.Client(base_url=run.url, timeout=20.0) as c:
            for stream in (False, True):
                body = {"model": MODEL, "prompt": [POISON, 1, 2], "max_tokens": 3,
                        "stream": stream}
                r = c.post("/v1/completions", json=body)
                assert r.status_code == (200 if stream else 500), r.text
                assert "Overflow" in r.text
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": [POISON, POISON],
                                                "max_tokens": 3})
            assert r.status_code == 500 and "int too large" in r.text
            for bad in ({"prompt": [1] * 9000, "max_tokens": 3},  # beyond the context
                        {"prompt": [1] * 5000, "max_tokens": 3},  # beyond the KV pool
                        {"prompt": "hi", "max_tokens": -1}):  # invalid
                r = c.post("/v1/completions", json={"model": MODEL, **bad})
                assert r.status_code == 400, r.text
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3],
                                                "max_tokens": 3, "ignore_eos": True})
            assert r.status_code == 200, r.text
        assert _success(run.url) == {"stop": 0, "length": 1, "abort": 0, "error": 3,
                                     "repetition": 0}
        # idle after the failures: nothing left running, waiting or holding KV
        assert _gauges(run.url) == dict.fromkeys(_gauges(run.url), 0.0)
    finally:
        run.stop()
