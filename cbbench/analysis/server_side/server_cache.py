"""The prefix cache's hits as the server reported them: ``usage.prompt_tokens_details.
cached_tokens`` per request (vLLM with --enable-prompt-tokens-details, SGLang, OpenAI), summed
over the completed requests that carried it: hit rate = cached tokens / the server's prompt
tokens. Beside it, for the in-process engine, summary.engine.prefix_cache_hit_rate is the
engine's own count. Both count a request's prompt once, at its first scheduling, as vLLM's
prefix_cache_queries / prefix_cache_hits and its usage's cached_tokens do (a request resumed
after a preemption is not counted again; `cbbench serve` reports the engine's num_cached_tokens,
set at that first scheduling). They are not the same set of requests: the engine's covers
every request it scheduled, the server's only the completed ones that carried cached_tokens, so
the two rates match only when those sets do."""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.analysis.records import RequestRecord


def server_prefix_cache(records: Sequence[RequestRecord]) -> dict | None:
    """{"requests", "cached_tokens", "prompt_tokens", "hit_rate"}, or None when no completed
    request carried cached_tokens."""
    seen = [r for r in records if r.ok and r.cached_tokens is not None]
    if not seen:
        return None
    cached = sum(r.cached_tokens or 0 for r in seen)  # every one is set (seen)
    prompt = sum(r.server_prompt_tokens if r.server_prompt_tokens is not None
                 else r.prompt_tokens for r in seen)
    return {
        "requests": len(seen),
        "cached_tokens": cached,
        "prompt_tokens": prompt,
        "hit_rate": cached / prompt if prompt else None,
    }
