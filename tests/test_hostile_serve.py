"""Hostile clients against `cbbench serve --engine torch --model tiny` run as a user runs it (its
own process): no request body, whatever its fields hold, may take the server down.

The fuzz test sends random JSON bodies (every field the server reads, with random types and
values, beside well-formed ones) and checks after each that /health is 200 and a normal request
still completes. Under the default ("ci") profile it runs FUZZ_EXAMPLES bodies; the thorough
profile (HYPOTHESIS_PROFILE=thorough) runs helpers.THOROUGH_EXAMPLES.
"""

from __future__ import annotations

import httpx
import pytest
from helpers import serve_process

pytest.importorskip("torch")

TIMEOUT_S = 30.0
NORMAL = {"prompt": [1, 2, 3], "max_tokens": 2}


@pytest.fixture(scope="module")
def torch_server():
    with serve_process("--engine", "torch", "--device", "cpu", "--model", "tiny",
                       "--num-kv-blocks", "64", "--max-model-len", "128") as run:
        yield run


@pytest.fixture()
def client(torch_server):
    with httpx.Client(base_url=torch_server.url.removesuffix("/v1"), timeout=TIMEOUT_S) as c:
        yield c


def assert_still_serving(c: httpx.Client) -> None:
    assert c.get("/health").status_code == 200
    r = c.post("/v1/completions", json=NORMAL)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == NORMAL["max_tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_huge_top_k_on_the_torch_server(client, stream):
    """Issue 19's critical defect: this request killed the engine thread for good."""
    body = {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 1, "top_p": 0.5,
            "top_k": 2**63, "stream": stream}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert_still_serving(client)
