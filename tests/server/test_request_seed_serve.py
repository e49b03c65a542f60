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
