"""A request near the context, on `cbbench serve --max-model-len 256` (sixth review), answered
as vLLM answers it: a chat (or Responses) request without an output limit gets the context
its prompt leaves (vLLM's get_max_tokens), where 16 made a 252-token prompt a 400; completions
keep vLLM's 16."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.server.context import Served
from cbbench.server.text import HashedWordCodec

CONTEXT = 256


@pytest.fixture(scope="module")
def client():
    run = start_server(lambda: build_serving_engine(sim_options(max_model_len=CONTEXT)))
    with httpx.Client(base_url=run.url, timeout=30.0) as c:
        yield c
    run.stop()


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def _chat(n_words: int, **kw) -> dict:
    return {"messages": [{"role": "user", "content": _words(n_words)}], **kw}


def test_a_chat_without_max_tokens_gets_the_context_its_prompt_leaves(client):
    r = client.post("/v1/chat/completions", json=_chat(250))  # 252 tokens with the template
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    assert u["prompt_tokens"] == 252 and u["completion_tokens"] == CONTEXT - 252
    assert r.json()["choices"][0]["finish_reason"] == "length"
    # Streamed the same; an explicit limit still wins (and still has to fit).
    with client.stream("POST", "/v1/chat/completions", json=_chat(
            250, stream=True, stream_options={"include_usage": True})) as s:
        last = json.loads([x for x in s.iter_lines() if x.startswith("data: {")][-1][5:])
    assert last["usage"]["completion_tokens"] == CONTEXT - 252
    r = client.post("/v1/chat/completions", json=_chat(10, max_tokens=3))
    assert r.json()["usage"]["completion_tokens"] == 3
    assert client.post("/v1/chat/completions", json=_chat(250, max_tokens=5)).status_code == 400


def test_the_responses_api_defaults_to_the_context_its_input_leaves(client):
    r = client.post("/v1/responses", json={"input": _words(250)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["input_tokens"] == 252
    assert body["usage"]["output_tokens"] == body["max_output_tokens"] == CONTEXT - 252
    assert body["status"] == "incomplete"  # it ran to max_output_tokens



def test_the_responses_api_takes_a_max_output_tokens_beyond_the_room_as_the_room(client):
    """vLLM's Responses caps max_output_tokens at the context its input leaves (get_max_tokens,
    the least of the two) where chat refuses; serve answered 400 in chat's words, naming
    max_tokens and max_completion_tokens, fields the request never had."""
    r = client.post("/v1/responses", json={"input": _words(250), "max_output_tokens": 100})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["output_tokens"] == body["max_output_tokens"] == CONTEXT - 252


def test_completions_keep_the_default_of_16(client):
    r = client.post("/v1/completions", json={"prompt": _words(100)})
    assert r.json()["usage"]["completion_tokens"] == 16
    # 250 + 16 > 256: vLLM refuses it too (its completions default is 16, not the room).
    assert client.post("/v1/completions", json={"prompt": _words(250)}).status_code == 400


def test_a_chat_whose_prompt_fills_the_context_is_still_refused(client):
    r = client.post("/v1/chat/completions", json=_chat(CONTEXT - 2))  # 256 tokens
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_rejected"


def test_the_room_is_the_context_or_the_kv_pool_whichever_is_less():
    def served(context, pool):
        return Served("m", HashedWordCodec(512), 512, context, 0, kv_capacity_tokens=pool)

    assert served(256, 4096).output_room(252) == 4
    assert served(8192, 4096).output_room(10) == 4086  # a pool under the context
    assert served(256, 4096).output_room(300) == 1  # the engine refuses it, with its reason
    assert served(None, None).output_room(10) is None


# ---- the over-context 400 in vLLM's words ------------------------------------------------------
# vLLM's OpenAI serving layer (serving_engine.py / engine/serving.py, _validate_input); clients
# read "maximum context length is N" out of them.
def test_max_tokens_beyond_the_context_is_refused_in_vllms_words(client):
    r = client.post("/v1/completions", json={"prompt": "a b c d", "max_tokens": 300})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == (
        "'max_tokens' or 'max_completion_tokens' is too large: 300. This model's maximum "
        "context length is 256 tokens and your request has 4 input tokens (300 > 256 - 4).")
    assert err["code"] == "request_rejected" and err["param"] is None
    r = client.post("/v1/chat/completions", json=_chat(1, max_completion_tokens=300))
    assert r.json()["error"]["message"].startswith(
        "'max_tokens' or 'max_completion_tokens' is too large: 300. This model's maximum "
        "context length is 256 tokens and your request has 3 input tokens")


def test_a_prompt_that_fills_the_context_is_refused_in_vllms_words(client):
    want = ("This model's maximum context length is 256 tokens. However, your request has "
            "{} input tokens. Please reduce the length of the input messages.")
    r = client.post("/v1/chat/completions", json=_chat(CONTEXT - 2))  # 256 tokens, no limit
    assert r.json()["error"]["message"] == want.format(256)
    r = client.post("/v1/completions", json={"prompt": _words(300), "max_tokens": 1})
    assert r.json()["error"]["message"] == want.format(300)
    # Each API's error shape, the same words.
    r = client.post("/v1/messages", json={"model": "llama-3.2-1b", "max_tokens": 300,
                                          "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "maximum context length is 256 tokens and your request has 3 input tokens" in (
        r.json()["error"]["message"])
    r = client.post("/v1/responses", json={"input": _words(300)})
    assert r.json()["error"]["message"] == want.format(302)


def test_a_request_beyond_the_kv_pool_keeps_the_engines_reason():
    run = start_server(lambda: build_serving_engine(sim_options(max_model_len=CONTEXT,
                                                                num_kv_blocks=4)))
    try:
        r = httpx.post(run.url + "/v1/completions", json={"prompt": _words(100), "max_tokens": 1},
                       timeout=30.0)
    finally:
        run.stop()
    assert r.status_code == 400 and "KV blocks" in r.json()["error"]["message"]
