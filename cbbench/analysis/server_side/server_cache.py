"""The prefix cache's hits as the server reported them: ``usage.prompt_tokens_details.
cached_tokens`` per request (vLLM with --enable-prompt-tokens-details, SGLang, OpenAI), summed
over the completed requests sent to an endpoint that reported it: hit rate = cached tokens /
the server's prompt tokens. vLLM writes prompt_tokens_details only when the count is non-zero
(its serving.py: ``if self.enable_prompt_tokens_details and num_cached_tokens``), so on an
endpoint that reported cached tokens for any request of the run, a usage without them is a
request that found none cached: a miss, in the denominator as in vllm:prefix_cache_queries.
Beside it, for the in-process engine, summary.engine.prefix_cache_hit_rate is the engine's
own count. Both count a request's prompt once, at its first scheduling, as vLLM's
prefix_cache_queries / prefix_cache_hits and its usage's cached_tokens do (a request resumed
after a preemption is not counted again; `cbbench serve` reports the engine's num_cached_tokens,
set at that first scheduling). They are not the same set of requests: the engine's covers
every request it scheduled, the server's only the completed ones, so the two rates match only
when those sets do."""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.analysis.records import RequestRecord


def reporting_endpoints(records: Sequence[RequestRecord]) -> set[str | None]:
    """The endpoints that sent cached_tokens on any request (one of them, None, in-process)."""
    return {r.endpoint for r in records if r.cached_tokens is not None}


def server_prefix_cache(records: Sequence[RequestRecord],
                        reporting: set[str | None] | None = None) -> dict | None:
    """{"requests", "cached_tokens", "prompt_tokens", "hit_rate"} over the completed requests
    to the ``reporting`` endpoints (default: those of ``records``), or None when there are
    none."""
    if reporting is None:
        reporting = reporting_endpoints(records)
    seen = [r for r in records if r.ok and r.endpoint in reporting]
    if not seen:
        return None
    cached = sum(r.cached_tokens or 0 for r in seen)  # unset: vLLM's usage for 0 cached
    prompt = sum(r.server_prompt_tokens if r.server_prompt_tokens is not None
                 else r.prompt_tokens for r in seen)
    return {
        "requests": len(seen),
        "cached_tokens": cached,
        "prompt_tokens": prompt,
        "hit_rate": cached / prompt if prompt else None,
    }
