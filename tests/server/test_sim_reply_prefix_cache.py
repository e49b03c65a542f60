"""`cbbench serve --engine sim --tokenizer DIR --enable-prefix-caching`: a multi-turn chat's
next turn finds the previous reply's blocks in the cache, as a real engine finds the ids it
generated and the in-process simulator its scripted replies (targets/engine_feed.py).

The simulated engine samples no ids; with a tokenizer its reply is scripted as "tok", then
" tok" each (server/text.py placeholder_reply_ids). The first has no leading space: the
Llama-3 template renders `message['content'] | trim`, so a reply " tok tok ..." came back as
"tok tok ..." and its first token as another id. Before, the reply's blocks were never
registered (no ids), and a 3-turn chat read cached_tokens 0/48/96 where the in-process
simulator (and block size 16 by hand) reads 0/64/128.

The truth: the Llama-3.1 tokenizer folder (skipped where absent)."""

from __future__ import annotations

import httpx
import pytest
from helpers import SERVE_BLOCK_SIZE, SERVE_MODEL, llama3_tokenizer_dir, sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.load.chat_template import load_chat_template
from cbbench.load.prompts import load_tokenizer
from cbbench.server.app import ServeConfig

HTTP_TIMEOUT_S = 30.0
USER_TURNS = [("Tell me about the history of Paris in two sentences, please.", 20),
              ("And now the same in French, if you would.", 25),
              ("Thanks. One more line about Lyon?", 10)]


@pytest.fixture(scope="module")
def folder() -> str:
    return llama3_tokenizer_dir()


@pytest.fixture(scope="module")
def server(folder):
    cfg = ServeConfig(tokenizer=load_tokenizer(folder), chat_template=load_chat_template(folder),
                      report_cached_tokens=True)
    run = start_server(lambda: build_serving_engine(sim_options(enable_prefix_caching=True)), cfg)
    yield run
    run.stop()


def test_the_next_turn_finds_the_previous_replys_blocks(server, folder):
    tok = load_tokenizer(folder)
    messages: list[dict] = []
    seen = []  # (prompt_tokens, completion_tokens, cached_tokens) per turn
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT_S) as client:
        for text, n in USER_TURNS:
            messages.append({"role": "user", "content": text})
            r = client.post("/v1/chat/completions", json={
                "model": SERVE_MODEL, "messages": messages, "max_tokens": n})
            assert r.status_code == 200, r.text
            body = r.json()
            reply = body["choices"][0]["message"]["content"]
            usage = body["usage"]
            # No leading space: the template's trim leaves it as sent, and it re-encodes to
            # the tokens the server counted.
            assert reply == reply.strip() and reply.startswith("tok")
            assert len(tok.encode(reply, add_special_tokens=False).ids) == n
            assert usage["completion_tokens"] == n
            seen.append((usage["prompt_tokens"], n,
                         usage["prompt_tokens_details"]["cached_tokens"]))
            messages.append({"role": "assistant", "content": reply})
    bs = SERVE_BLOCK_SIZE
    # Turn k + 1 finds every full block turn k computed: its prompt and its reply less the
    # last token (never computed), within its own prompt less one token.
    expected = [0] + [min((p + n - 1) // bs, (p_next - 1) // bs) * bs
                      for (p, n, _), (p_next, _, _) in zip(seen, seen[1:])]
    assert [c for _, _, c in seen] == expected
    assert expected[1] > (seen[0][0] // bs) * bs  # more than the first prompt's blocks


def test_a_completion_reply_re_encodes_to_its_token_count(server, folder):
    """Streamed completions: "tok", then " tok" each; the text's own encoding is the count."""
    tok = load_tokenizer(folder)
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT_S) as client:
        r = client.post("/v1/completions", json={"model": SERVE_MODEL, "prompt": "Hello there",
                                                 "max_tokens": 7})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text == "tok" + " tok" * 6
    assert len(tok.encode(text, add_special_tokens=False).ids) == 7
