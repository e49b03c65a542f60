"""``summary.speculative``: how well speculative decoding's drafts fared, as vLLM and SGLang
report it, from the engine's iteration records or from counters scraped off an endpoint.

- ``acceptance_rate`` = accepted / draft tokens (vLLM's spec_decode acceptance rate);
- ``mean_acceptance_length`` = 1 + accepted / drafts: tokens a request gains per verify step,
  the bonus (or correction) token included (vLLM's "mean acceptance length", SGLang's
  accept length);
- ``source``: ``engine`` (this run's engine counted them) or ``scraped`` (an endpoint's
  /metrics counters, before and after the run).
"""

from __future__ import annotations

from collections.abc import Sequence


def speculative_summary(
    num_drafts: int, draft_tokens: int, accepted_tokens: int, source: str
) -> dict:
    """The summary from the three counters (vLLM's num_drafts, num_draft_tokens,
    num_accepted_tokens); rates are None when nothing was drafted."""
    return {
        "acceptance_rate": accepted_tokens / draft_tokens if draft_tokens else None,
        "mean_acceptance_length": 1.0 + accepted_tokens / num_drafts if num_drafts else None,
        "drafts": int(num_drafts),
        "draft_tokens": int(draft_tokens),
        "accepted_tokens": int(accepted_tokens),
        "source": source,
    }


def engine_speculative(iterations: Sequence[dict], speculative_tokens: int | None) -> dict | None:
    """From a run's iteration records; None when the engine ran without speculation."""
    if not speculative_tokens:
        return None

    def total(key: str) -> int:
        return sum(it.get(key, 0) for it in iterations)

    out = speculative_summary(
        total("num_drafts"), total("draft_tokens"), total("accepted_tokens"), "engine"
    )
    out["speculative_tokens"] = speculative_tokens
    return out
