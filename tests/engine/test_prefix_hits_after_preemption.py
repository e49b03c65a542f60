"""The prefix cache's hit rate counts a request's first scheduling only, as vLLM's
PrefixCacheStats.record(..., preempted=request.num_preemptions > 0) does: a request resumed
after a recompute preemption re-finds its own blocks, which says nothing of the cache's reuse
across requests, so vLLM keeps those lookups apart (preempted_queries / preempted_hits) and
out of vllm:prefix_cache_hits / queries and the logged hit rate."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cbbench.cli.app import app

# Four random prompts that share nothing, in a pool too small for all four: they preempt.
RANDOM_UNDER_PRESSURE = ["run", "--engine", "sim", "--workload", "random", "--input-len", "200",
                         "--output-len", "200", "--num-requests", "4",
                         "--enable-prefix-caching", "--num-kv-blocks", "40", "--quiet"]


def test_a_resumed_request_refinding_its_own_blocks_is_no_hit(tmp_path):
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, [*RANDOM_UNDER_PRESSURE, "--output", str(out)])
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    eng = result["summary"]["engine"]
    assert eng["num_preemptions"] > 0  # the case under test: requests resumed
    # Nothing is shared: no hit, as `serve` reports per request (cached_tokens 0 each).
    assert eng["prefix_cache_hit_tokens"] == 0
    assert eng["prefix_cache_hit_rate"] == 0.0
    assert sum(q.get("cached_tokens") or 0 for q in result["requests"]) == 0
    # The resumed requests' lookups are kept apart, as vLLM's preempted counters.
    its = result["iterations"]
    resumed_hits = sum(it.get("num_preempted_cached_tokens", 0) for it in its)
    resumed_queried = sum(it.get("num_preempted_queried_tokens", 0) for it in its)
    assert resumed_hits > 0 and resumed_queried > 0
    assert eng["prefix_cache_preempted_hit_tokens"] == resumed_hits
    assert eng["prefix_cache_preempted_hit_rate"] == resumed_hits / resumed_queried
    # The hit rate's denominator: each request's prompt once.
    assert sum(it["num_prefix_queried_tokens"] for it in its) == sum(
        q["prompt_tokens"] for q in result["requests"])


def test_a_run_without_a_resumed_lookup_keeps_its_keys(tmp_path):
    """No preemption: the records and the summary hold no preempted keys (results as before)."""
    out = tmp_path / "r.json"
    args = [a if a != "40" else "400" for a in RANDOM_UNDER_PRESSURE]
    r = CliRunner().invoke(app, [*args, "--output", str(out)])
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    eng = result["summary"]["engine"]
    assert eng["num_preemptions"] == 0
    assert "prefix_cache_preempted_hit_rate" not in eng
    assert not any("num_preempted_queried_tokens" in it for it in result["iterations"])
