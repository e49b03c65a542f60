"""The engine's hook behind `POST /reset_prefix_cache` (vLLM's semantics)."""

from __future__ import annotations

from cbbench.engine.core.block_manager import BlockManager
from cbbench.engine.core.prefix_caching import PrefixCachingBlockManager
from cbbench.engine.core.request import Request

BLOCK = 4


def _req(i: int, ids: list[int]) -> Request:
    return Request(i, len(ids), 4, prompt_token_ids=ids)


def test_reset_forgets_cached_prefixes_only_when_idle():
    bm = PrefixCachingBlockManager(16, BLOCK)
    ids = list(range(12))
    a = _req(0, ids)
    assert bm.allocate(a, 12)
    a.num_computed_tokens = 12
    assert bm.reset_prefix_cache() is False  # a request holds blocks: nothing dropped
    bm.free(a)
    b = _req(1, ids)
    assert len(bm.lookup_prefix(b)) == 2  # cached after the free (12 tokens: 2 of 3 blocks)
    assert bm.reset_prefix_cache() is True
    assert bm.lookup_prefix(_req(2, ids)) == [] and bm.num_cached_blocks == 0
    assert bm.num_free_blocks == 16 and len(bm._free) == 16


def test_reset_without_prefix_caching_is_a_no_op():
    assert BlockManager(8, BLOCK).reset_prefix_cache() is True
