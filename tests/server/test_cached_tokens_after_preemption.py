"""`cached_tokens` is the prefix cache's hits at a request's first scheduling, as vLLM's v1
scheduler sets it (once), not those of its resume after a preemption (sixth review): two
concurrent chats of never-seen prompts on a KV pool too small for both; the preempted one's
prompt was computed from scratch, and its usage says 0 cached, as the request log does."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers import sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig

MAX_TOKENS = 150  # 62 + 150 tokens: 14 blocks of 16 each, 28 for two in a pool of 20


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_a_preempted_request_reports_its_first_schedulings_cache_hits(tmp_path, stream):
    log = tmp_path / "serve.jsonl"
    run = start_server(
        lambda: build_serving_engine(sim_options(enable_prefix_caching=True, num_kv_blocks=20)),
        ServeConfig(request_log=str(log), report_cached_tokens=True))

    def one(k: int) -> dict:
        text = " ".join(f"{k}x{i}" for i in range(60))
        body: dict = {"messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS}
        with httpx.Client(timeout=60.0) as c:
            if not stream:
                return c.post(run.url + "/v1/chat/completions", json=body).json()["usage"]
            body.update(stream=True, stream_options={"include_usage": True})
            with c.stream("POST", run.url + "/v1/chat/completions", json=body) as r:
                chunks = [json.loads(x[5:]) for x in r.iter_lines()
                          if x.startswith("data: {")]
            return chunks[-1]["usage"]

    try:
        with ThreadPoolExecutor(2) as pool:
            usages = list(pool.map(one, range(2)))
    finally:
        run.stop()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(x["preemptions"] for x in lines) == [0, 1]  # the scenario: one preempted
    assert [x["cached_tokens"] for x in lines] == [0, 0]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 0]
    assert all(u["completion_tokens"] == MAX_TOKENS for u in usages)
