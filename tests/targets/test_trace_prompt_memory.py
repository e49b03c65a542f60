"""A trace's hash-block prompts on the simulator with prefix caching: read from the shared
blocks when hashed, not held as a copy per request (3,000 Mooncake-like prompts of ~12k tokens
held 0.7 GB before the first request, results/engine_memory/README.md), with every figure of
the run the same as with the prompts' ids given whole."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from cbbench.engine.args import EngineArgs
from cbbench.load.hash_blocks import MOONCAKE_BLOCK_TOKENS as BS
from cbbench.load.hash_blocks import HashBlockIds, expand_hash_ids
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.engine import _make_requests, build_engine, run_engine

PC = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", enable_prefix_caching=True)


def _trace() -> list[WorkloadRequest]:
    """Shared prefixes, a last block cut short, and prompts longer than their hash ids (a
    request's own tail)."""
    rows = [((1, 2, 3), 1400), ((1, 2, 3), 1536), ((1, 2, 4), 1300), ((1,), 1100),
            ((1, 2, 3, 5), 1900), ((9,), 400), ((1, 2), 3000)]
    return [WorkloadRequest(i, n, 20 + i, hash_ids=h) for i, (h, n) in enumerate(rows)]


def test_views_read_as_the_whole_prompt() -> None:
    for w in _trace():
        assert w.hash_ids is not None
        view = HashBlockIds(w.id, w.hash_ids, w.prompt_len)
        whole = expand_hash_ids(w.id, w.hash_ids, w.prompt_len)
        assert len(view) == len(whole) and tuple(view) == whole
        for a, b in [(0, 16), (500, 530), (BS - 1, 2 * BS + 1), (len(whole) - 20, len(whole) + 5),
                     (-7, None)]:
            assert view[a:b] == whole[a:b]
        mid = len(whole) * 2 // 3
        assert view[mid] == whole[mid] and view[-1] == whole[-1]
        with pytest.raises(IndexError):
            view[len(whole)]


def test_run_is_the_same_as_with_whole_prompts() -> None:
    """The same run, its prompts given as hash ids (read lazily) or as their ids: every record
    and every iteration equal, prefix-cache hits included."""
    traced = _trace()
    whole = [dataclasses.replace(w, hash_ids=None, prompt_token_ids=w.token_ids())
             for w in traced]
    arrivals = np.arange(len(traced)) * 0.05
    a, b = run_engine(PC, traced, arrivals), run_engine(PC, whole, arrivals)
    assert a.records == b.records and a.iterations == b.iterations
    assert sum(it["num_cached_tokens"] for it in a.iterations) > 0


def test_requests_hold_no_copy_of_the_prompts() -> None:
    """Eight prompts of 64 distinct blocks (32k tokens each): building the requests held each
    prompt as a list (2 MiB for the eight, plus an int object per id above 256); now a few
    hundred bytes a request."""
    wreqs = [WorkloadRequest(i, 64 * BS, 10, hash_ids=tuple(range(64 * i, 64 * i + 64)))
             for i in range(8)]
    _, info = build_engine(PC)
    tracemalloc.start()
    try:
        reqs = _make_requests(wreqs, np.zeros(len(wreqs)), PC, info)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(reqs) == 8
    assert held < 64 * 1024, held
