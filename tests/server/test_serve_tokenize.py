"""`cbbench serve`'s /tokenize and /detokenize (vLLM's shapes) and /v1/models' context length,
with the word-per-token fallback and, when the shared Llama-3 tokenizer.json is on this machine
(it is never copied into the repo), with it. Every network loop here is bounded.
"""

from __future__ import annotations

import httpx
import pytest
from helpers import SERVE_CONTEXT as CONTEXT
from helpers import SERVE_MODEL as MODEL
from helpers import llama3_tokenizer_dir, sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.load.chat_template import load_chat_template
from cbbench.load.prompts import load_tokenizer
from cbbench.server.app import ServeConfig
from cbbench.server.text import FALLBACK_KIND, TOKENIZER_KIND

BOS = 128000  # <|begin_of_text|>
TEXT = "Hello, world! The quick brown fox jumps over the lazy dog. ünïcödé ✓ 日本語"


def client_for(run) -> httpx.Client:
    return httpx.Client(base_url=run.url, timeout=30.0)


@pytest.fixture(scope="module")
def fallback():
    run = start_server(lambda: build_serving_engine(sim_options()))
    with client_for(run) as c:
        yield c
    run.stop()


@pytest.fixture(scope="module")
def llama3():
    folder = llama3_tokenizer_dir()  # as `cbbench serve --tokenizer DIR` loads it
    cfg = ServeConfig(tokenizer=load_tokenizer(folder), chat_template=load_chat_template(folder))
    run = start_server(lambda: build_serving_engine(sim_options()), cfg)
    with client_for(run) as c:
        yield c
    run.stop()


# ---- the word-per-token fallback ---------------------------------------------------------------
def test_fallback_tokenize_is_one_token_per_word_and_says_so(fallback):
    r = fallback.post("/tokenize", json={"model": MODEL, "prompt": "12 7 hello  there\n"})
    assert r.status_code == 200
    body = r.json()
    assert body["tokenizer"] == FALLBACK_KIND
    assert body["count"] == 4 and len(body["tokens"]) == 4
    assert body["tokens"][:2] == [12, 7]  # a decimal word is its id
    assert body["max_model_len"] == CONTEXT
    assert "token_strs" not in body
    # The count is what generation sees.
    usage = fallback.post("/v1/completions", json={"prompt": "12 7 hello  there\n", "max_tokens": 1})
    assert usage.json()["usage"]["prompt_tokens"] == body["count"]


def test_fallback_ids_round_trip_through_detokenize(fallback):
    ids = [0, 5, 99, 12345, 42]
    r = fallback.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200
    assert r.json() == {"prompt": "0 5 99 12345 42", "tokenizer": FALLBACK_KIND}
    back = fallback.post("/tokenize", json={"prompt": r.json()["prompt"], "return_token_strs": True})
    assert back.json()["tokens"] == ids
    assert back.json()["token_strs"] == ["0", "5", "99", "12345", "42"]


def test_chat_tokenize_counts_what_chat_completions_feeds_the_engine(fallback):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    tok = fallback.post("/tokenize", json={"messages": msgs}).json()
    chat = fallback.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}).json()
    assert tok["count"] == chat["usage"]["prompt_tokens"]
    bare = fallback.post("/tokenize", json={"messages": msgs, "add_generation_prompt": False})
    assert bare.json()["count"] == tok["count"] - 1  # without the "<|assistant|>" line


@pytest.mark.parametrize(
    "path,payload,status,param",
    [
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
        ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
        ("/detokenize", b"{not json", 400, None),
    ],
)
def test_bad_tokenize_requests_get_openai_style_errors(fallback, path, payload, status, param):
    if isinstance(payload, bytes):
        r = fallback.post(path, content=payload, headers={"content-type": "application/json"})
    else:
        r = fallback.post(path, json=payload)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param


def test_models_reports_max_model_len(fallback):
    card = fallback.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["max_model_len"] == CONTEXT


# ---- the Llama-3 tokenizer ---------------------------------------------------------------------
def test_llama3_tokenize_detokenize_round_trip(llama3):
    r = llama3.post("/tokenize", json={"prompt": TEXT, "add_special_tokens": False})
    body = r.json()
    assert body["tokenizer"] == TOKENIZER_KIND
    assert BOS not in body["tokens"] and body["count"] == len(body["tokens"]) > 10
    back = llama3.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back["prompt"] == TEXT

    # The default adds the BOS, as vLLM's does; /detokenize writes special tokens out.
    with_bos = llama3.post("/tokenize", json={"prompt": TEXT, "return_token_strs": True}).json()
    assert with_bos["tokens"] == [BOS, *body["tokens"]]
    assert with_bos["token_strs"][0] == "<|begin_of_text|>"
    text = llama3.post("/detokenize", json={"tokens": with_bos["tokens"]}).json()["prompt"]
    assert text == "<|begin_of_text|>" + TEXT
    # What generation counts, BOS included.
    usage = llama3.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == with_bos["count"]


def test_llama3_chat_tokenize_matches_chat_usage(llama3):
    msgs = [{"role": "user", "content": TEXT}]
    tok = llama3.post("/tokenize", json={"messages": msgs}).json()
    chat = llama3.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}).json()
    assert tok["count"] == chat["usage"]["prompt_tokens"]
    assert tok["tokens"][0] == BOS
