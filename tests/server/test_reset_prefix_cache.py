"""`POST /reset_prefix_cache` on `cbbench serve` (issue 40; vLLM's route and semantics): the
cached prefixes are dropped when the server is idle. (The refusal while a request holds KV
blocks is tested on the block manager: tests/engine/test_prefix_reset.py.)"""

from __future__ import annotations

import httpx
import pytest
from helpers import sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig

PROMPT = list(range(100, 164))  # 64 tokens: four full blocks of 16


@pytest.fixture(scope="module")
def srv():
    # As `cbbench serve --enable-prefix-caching` configures it: the cached tokens reported.
    run = start_server(lambda: build_serving_engine(sim_options(enable_prefix_caching=True)),
                       ServeConfig(report_cached_tokens=True))
    yield run
    run.stop()


def cached_tokens(c: httpx.Client) -> int:
    r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_reset_drops_the_cached_prefix(srv):
    with httpx.Client(base_url=srv.url, timeout=30.0) as c:
        cached_tokens(c)
        assert cached_tokens(c) > 0  # the second send meets the first one's blocks
        r = c.post("/reset_prefix_cache")
        assert r.status_code == 200 and r.json() == {"reset": True}
        assert cached_tokens(c) == 0  # the cache was emptied
        assert c.get("/reset_prefix_cache").status_code == 405  # POST only, as vLLM

