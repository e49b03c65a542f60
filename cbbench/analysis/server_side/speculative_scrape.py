"""Speculative decoding as the server counts it, from the /metrics it exposed during the run
(--scrape-metrics): ``summary.speculative`` with source "scraped".

- vLLM (V1): the counters ``vllm:spec_decode_num_drafts_total``,
  ``vllm:spec_decode_num_draft_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_total``,
  grown over the run's scrapes (reset-aware): acceptance_rate = accepted / draft tokens,
  mean_acceptance_length = 1 + accepted / drafts (the bonus token included), as vLLM's
  benchmarks report them.
- SGLang: the gauge ``sglang:spec_accept_length`` (its mean accepted length per verify step,
  the bonus token included): averaged over the run's scrapes that read one (its 0 means no
  speculation, or no decode window logged yet); SGLang exports no draft count, so no
  acceptance rate.

Counter values are summed over their label sets (one per engine or model), each label set's
growth reset-aware over every kept scrape as Prometheus' increase() is: a value that fell (the
server restarted) counts from 0 again. A restart between two kept scrapes whose new count
passed the old one is not seen (as in Prometheus); a thinned time series (targets/scrape.py)
widens that gap.
"""

from __future__ import annotations

from collections.abc import Sequence

VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SOURCE = "scraped"


def _counter_growth(rows: Sequence[dict], name: str) -> float | None:
    """The counter's growth over the run's scrapes, as Prometheus' increase() counts it
    (without its extrapolation to the window's edges): per label set, the rise between each
    scrape and the next, and where the value fell (the server restarted: a counter starts
    again from 0) the value after the fall. Summed over the label sets; None when it was never
    seen. The first scrape against the last missed a restart whose new count passed the old
    one (acceptance 0.456 where increase() gives 0.519)."""
    series: dict[tuple, dict[float, float]] = {}
    for r in rows:
        if r["name"] == name:
            by_time = series.setdefault(tuple(sorted(r["labels"].items())), {})
            by_time[r["t_s"]] = by_time.get(r["t_s"], 0.0) + float(r["value"])
    if not series:
        return None
    growth = 0.0
    for by_time in series.values():
        values = [by_time[t] for t in sorted(by_time)]
        growth += sum(b - a if b >= a else b for a, b in zip(values, values[1:]))
    return growth


def scraped_speculative(rows: Sequence[dict] | None) -> dict | None:
    """summary.speculative from a run's scraped server metrics, or None when the server
    exposes no speculative-decoding figure."""
    if not rows:
        return None
    drafts = _counter_growth(rows, VLLM_DRAFTS)
    draft_tokens = _counter_growth(rows, VLLM_DRAFT_TOKENS)
    accepted = _counter_growth(rows, VLLM_ACCEPTED)
    if draft_tokens is not None and accepted is not None:
        return {
            "source": SOURCE,
            "server": "vllm",
            "drafts": drafts,
            "draft_tokens": draft_tokens,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        }
    # SGLang exports the gauge on every server, 0 when it does not speculate and until its
    # first decode log window; an accept length counts the bonus token, so it is >= 1 once
    # measured: a 0 is no reading (a non-speculating server read as "mean length 0").
    lengths = [v for r in rows if r["name"] == SGLANG_ACCEPT_LENGTH
               and (v := float(r["value"])) > 0]
    if lengths:
        return {
            "source": SOURCE,
            "server": "sglang",
            "acceptance_rate": None,
            "mean_acceptance_length": sum(lengths) / len(lengths),
            "scrapes": len(lengths),
        }
    return None
