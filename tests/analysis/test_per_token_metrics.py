"""Per-token ITL, the per-event gap, tokens per event, TTFOT and the reasoning figures on
hand-computed records (issue 24)."""

from __future__ import annotations

import numpy as np
import pytest

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.columns import request_columns
from cbbench.analysis.summary.metrics import latency_distributions, token_gaps_s
from cbbench.analysis.table import latency_table
from cbbench.targets.engine import split_reasoning


def rec(times, tokens=None, **kw) -> RequestRecord:
    n = sum(tokens) if tokens else len(times)
    return RequestRecord(id=0, prompt_tokens=4, output_tokens=n, intended_start_s=0.0,
                         send_s=0.0, token_times_s=list(times), event_tokens=tokens, **kw)


def dists(records: list[RequestRecord]) -> dict:
    """The latency distributions of the completed ``records``, through their columns."""
    cols = request_columns(records)
    return latency_distributions(cols, np.flatnonzero(cols.ok))


def test_an_event_of_k_tokens_gives_k_gaps_of_a_kth():
    r = rec([0.1, 0.4, 0.6], [1, 3, 2])  # 6 tokens in 3 events
    per_token, per_event, k = token_gaps_s(r)
    assert per_token.tolist() == pytest.approx([0.1] * 5)  # 0.3/3 x3, 0.2/2 x2
    assert per_event.tolist() == pytest.approx([0.3, 0.2])
    assert k.tolist() == [1, 3, 2]
    # TPOT is unchanged: (last - first) / (tokens - 1) = 0.5 / 5.
    assert r.tpot_s == pytest.approx(0.1)
    d = dists([r])
    assert d["itl_ms"]["p50"] == pytest.approx(100.0) and d["itl_ms"]["count"] == 5
    assert d["event_gap_ms"]["mean"] == pytest.approx(250.0) and d["event_gap_ms"]["count"] == 2
    assert d["tokens_per_event"]["mean"] == pytest.approx(2.0)


def test_in_process_tokens_of_one_step_share_a_time():
    # No per-event counts: runs of equal times are one step's tokens (speculative decoding).
    r = rec([0.1, 0.1, 0.4, 0.4, 0.4])
    assert r.events() == ([0.1, 0.4], [2, 3])
    assert token_gaps_s(r)[0].tolist() == pytest.approx([0.1, 0.1, 0.1])


def test_one_token_per_event_is_the_old_itl():
    r = rec([0.1, 0.15, 0.35])
    assert token_gaps_s(r)[0].tolist() == pytest.approx([0.05, 0.2])
    assert token_gaps_s(r)[1].tolist() == pytest.approx([0.05, 0.2])


def test_ttfot_and_reasoning():
    reasoned = rec([0.2, 0.3, 0.5, 0.6], reasoning_tokens=2, first_output_s=0.5)
    plain = rec([0.1, 0.2], reasoning_tokens=0)
    only_reasoning = rec([0.1, 0.2], reasoning_tokens=2)  # no answer token came
    assert reasoned.ttft_s == pytest.approx(0.2) and reasoned.ttfot_s == pytest.approx(0.5)
    assert plain.ttfot_s == plain.ttft_s
    assert only_reasoning.ttfot_s is None
    d = dists([reasoned, plain, only_reasoning])
    assert d["ttft_ms"]["count"] == 3
    assert d["ttfot_ms"]["count"] == 2 and d["ttfot_ms"]["mean"] == pytest.approx(300.0)
    assert d["reasoning_time_ms"]["count"] == 1
    assert d["reasoning_time_ms"]["mean"] == pytest.approx(300.0)  # 0.5 - 0.2
    assert d["reasoning_tokens"]["mean"] == pytest.approx(4 / 3)
    assert d["reasoning_share"]["mean"] == pytest.approx((0.5 + 0 + 1) / 3)
    summary = {**d, "client_bound": {}}
    assert "TTFOT (ms)" in latency_table(summary)
    assert "TTFOT" not in latency_table({**dists([plain]), "client_bound": {}})


def test_split_reasoning_on_an_engine_record():
    r = rec([0.1, 0.2, 0.3, 0.4])
    split_reasoning(r, 3)
    assert r.reasoning_tokens == 3 and r.first_output_s == 0.4
    r = rec([0.1, 0.2])
    split_reasoning(r, 3)  # cut short: all of it was reasoning
    assert r.reasoning_tokens == 2 and r.first_output_s is None
