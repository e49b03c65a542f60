"""Streamed /v1/messages under --enable-prefix-caching reports the prefix cache's hits as the
non-streamed message does (sixth review): ``message_start``'s usage has input_tokens less the
cache reads and ``cache_read_input_tokens`` (the client reads them there), and
``message_delta``'s usage is the cumulative count of every field. Checked raw, through the
anthropic SDK, and end to end: ``cbbench run --api anthropic`` against ``cbbench serve``, then
``cbbench audit`` against its request log."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from helpers import CBBENCH, SERVE_MODEL, logged_server, serve_process, sim_options

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig

WORDS = 60  # 62 prompt tokens with the template: 48 of them (3 blocks of 16) cacheable
PROMPT = " ".join(f"w{i}" for i in range(WORDS))
MAX_TOKENS = 3
BLOCK = 16


@pytest.fixture
def served(tmp_path):
    log = tmp_path / "serve.jsonl"
    with logged_server(log, lambda: build_serving_engine(sim_options(enable_prefix_caching=True)),
                       ServeConfig(request_log=str(log), report_cached_tokens=True)) as served:
        yield served


def _body(prompt: str = PROMPT, **kw) -> dict:
    return {"model": SERVE_MODEL, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": prompt}], **kw}


def _events(c: httpx.Client, url: str, body: dict) -> list[dict]:
    out = []
    with c.stream("POST", url + "/v1/messages", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                out.append(json.loads(line[5:]))
    return out


def test_a_streamed_message_reports_its_cache_hits_in_message_start(served):
    run, read_log = served
    with httpx.Client(timeout=30.0) as c:
        first = c.post(run.url + "/v1/messages", json=_body()).json()  # fills the cache
        evs = _events(c, run.url, _body(stream=True))
        cold = _events(c, run.url, _body("a fresh prompt nobody sent before", stream=True))
    start, *_, delta, stop = evs
    assert start["type"] == "message_start" and stop["type"] == "message_stop"
    assert [e["type"] for e in evs[1:3]] == ["content_block_start", "content_block_delta"]
    log = read_log()
    line = log[start["message"]["id"]]
    prompt, cached = line["prompt_tokens"], line["cached_tokens"]
    assert cached == (prompt - 1) // BLOCK * BLOCK > 0
    assert start["message"]["usage"] == {
        "input_tokens": prompt - cached, "output_tokens": 0,
        "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
    assert delta["type"] == "message_delta"
    assert delta["usage"] == {
        "input_tokens": prompt - cached, "output_tokens": MAX_TOKENS,
        "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
    # The non-streamed answer of the same prompt says the same.
    assert log[first["id"]]["cached_tokens"] == 0
    assert first["usage"]["cache_read_input_tokens"] == 0
    # A prompt the cache has not seen: nothing read, every token input.
    cold_line = log[cold[0]["message"]["id"]]
    assert cold[0]["message"]["usage"]["cache_read_input_tokens"] == cold_line["cached_tokens"] == 0
    assert cold[0]["message"]["usage"]["input_tokens"] == cold_line["prompt_tokens"]


def test_the_anthropic_sdk_reads_the_cache_hits_of_a_stream(served):
    anthropic = pytest.importorskip("anthropic")
    run, read_log = served
    client = anthropic.Anthropic(base_url=run.url, api_key="x", max_retries=0, timeout=30.0)
    client.messages.create(**_body())
    with client.messages.stream(**_body()) as s:
        start = next(e for e in s if e.type == "message_start")
        msg = s.get_final_message()
    client.close()
    line = read_log()[msg.id]
    assert line["cached_tokens"] > 0
    for u in (start.message.usage, msg.usage):
        assert u.cache_read_input_tokens == line["cached_tokens"]
        assert u.input_tokens + u.cache_read_input_tokens == line["prompt_tokens"]
    assert msg.usage.output_tokens == MAX_TOKENS


def test_cbbench_run_api_anthropic_passes_audit_with_prefix_caching(tmp_path):
    """The reviewer's run: three requests of one 70-word prompt, one at a time, so the second
    and third find its blocks cached. The client's cached_tokens are the log's."""
    wl, res, log = tmp_path / "wl.jsonl", tmp_path / "res.json", tmp_path / "serve.jsonl"
    text = " ".join(f"q{i}" for i in range(70))
    wl.write_text("".join(json.dumps({"prompt": text, "output_len": 4}) + "\n" for _ in range(3)))
    with serve_process("--engine", "sim", "--model", "llama-3-8b", "--gpu", "H200",
                       "--enable-prefix-caching", "--request-log", str(log)) as srv:
        out = subprocess.run(
            [*CBBENCH, "run", "--endpoint", srv.url, "--api", "anthropic", "--workload", str(wl),
             "--num-requests", "3", "--max-concurrency", "1", "--save-detailed",
             "--output", str(res)],
            capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    rep_path = tmp_path / "audit.json"
    audit = subprocess.run([*CBBENCH, "audit", str(res), "--server-log", str(log),
                            "--output", str(rep_path)], capture_output=True, text=True,
                           timeout=120)
    rep = json.loads(rep_path.read_text())
    assert rep["joined"] == 3
    assert rep["metrics"]["cached_tokens"]["mismatched"] == 0, rep["metrics"]["cached_tokens"]
    assert audit.returncode == 0, audit.stdout + audit.stderr
    cached = [r["cached_tokens"] for r in json.loads(res.read_text())["requests"]]
    assert sorted(cached) == [0, cached[1], cached[1]] and cached[1] > 0
