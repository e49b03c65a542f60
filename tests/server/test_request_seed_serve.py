"""`cbbench serve --engine torch`: a request's ``seed`` reproduces its completion (seventh
review; tests/engine/test_request_seed.py holds the engine's rule). Before, three identical
requests with ``"seed": 42`` got three different texts: the noise mixed in the server's request
counter. Requests without a seed still differ from each other."""

from __future__ import annotations

import httpx
import pytest
from helpers import serve_process

pytest.importorskip("torch")

TIMEOUT_S = 60.0
BODY = {"prompt": [5, 17, 300, 42, 8, 99], "max_tokens": 12, "temperature": 1.0}


@pytest.fixture(scope="module")
def client():
    with serve_process("--engine", "torch", "--device", "cpu", "--model", "tiny",
                       "--num-kv-blocks", "64") as run, \
            httpx.Client(base_url=run.url, timeout=TIMEOUT_S) as c:
        yield c


def _text(client, **fields) -> str:
    r = client.post("/v1/completions", json={**BODY, **fields})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == BODY["max_tokens"]
    return r.json()["choices"][0]["text"]


def test_the_same_seed_gives_the_same_text(client):
    texts = {_text(client, seed=42) for _ in range(3)}
    assert len(texts) == 1, texts
    assert _text(client, seed=43) not in texts
    # The chat API the same (its own prompt, so its own text).
    chat = {"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 12,
            "temperature": 1.0, "seed": 42}
    answers = {client.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]
               ["content"] for _ in range(2)}
    assert len(answers) == 1, answers


def test_requests_without_a_seed_differ(client):
    assert len({_text(client) for _ in range(3)}) == 3


def test_streamed_and_whole_answers_agree_through_the_sdks(client):
    """The same seeded request streamed and not, as the openai and anthropic SDKs read them:
    the same text, and usage that counts the tokens asked for (eighth review)."""
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    url, n, seeded = str(client.base_url), 6, {"temperature": 1.0, "seed": 11}
    msgs = [{"role": "user", "content": "a b c"}]
    oa = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S)
    an = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=TIMEOUT_S)
    whole = oa.chat.completions.create(model="tiny", messages=msgs, max_tokens=n, **seeded)
    chunks = list(oa.chat.completions.create(model="tiny", messages=msgs, max_tokens=n,
                                             stream=True, stream_options={"include_usage": True},
                                             **seeded))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        whole.choices[0].message.content
    assert chunks[-1].usage == whole.usage and whole.usage.completion_tokens == n
    assert {c.id for c in chunks} == {chunks[0].id}

    cmpl = oa.completions.create(model="tiny", prompt="a b c", max_tokens=n, **seeded)
    parts = list(oa.completions.create(model="tiny", prompt="a b c", max_tokens=n, stream=True,
                                       stream_options={"include_usage": True}, **seeded))
    assert "".join(c.choices[0].text for c in parts if c.choices) == cmpl.choices[0].text
    assert parts[-1].usage == cmpl.usage and cmpl.usage.completion_tokens == n

    resp = oa.responses.create(model="tiny", input="a b c", max_output_tokens=n,
                               extra_body=seeded)
    events = list(oa.responses.create(model="tiny", input="a b c", max_output_tokens=n,
                                      stream=True, extra_body=seeded))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        resp.output_text == whole.choices[0].message.content  # the chat template's prompt
    assert events[-1].response.usage == resp.usage and resp.usage.output_tokens == n

    msg = an.messages.create(model="tiny", max_tokens=n, messages=msgs, extra_body=seeded)
    with an.messages.stream(model="tiny", max_tokens=n, messages=msgs,
                            extra_body=seeded) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[0].text == resp.output_text
    assert (final.usage.input_tokens, final.usage.output_tokens) == \
        (msg.usage.input_tokens, n) == (whole.usage.prompt_tokens, n)
    assert final.stop_reason == msg.stop_reason == "max_tokens"
    oa.close()
    an.close()
