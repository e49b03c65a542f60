"""The interactive page's figures held to hand-made runs: the throughput over time counts each
token when it streamed (as summary.slices does), and the per-iteration plots keep every peak."""

from __future__ import annotations

import numpy as np
import pytest

from cbbench.analysis.comparison.compare import Labeled
from cbbench.report import interactive

BIN_S = 0.1  # the hand-made run lasts TIME_BINS * BIN_S s


def _request(i: int, start: float, times: list[float], **kw) -> dict:
    n = kw.pop("output_tokens", len(times))
    return {"id": i, "prompt_tokens": 8, "output_tokens": n, "intended_start_s": start,
            "ttft_ms": (times[0] - start) * 1000, "e2el_ms": (times[-1] - start) * 1000,
            "token_times_s": times, **kw}


def _run(requests: list[dict]) -> dict:
    return {"schema_version": 1, "config": {}, "summary": {}, "requests": requests}


def test_output_tokens_are_counted_when_they_streamed_not_at_the_requests_end():
    # The page booked every output token at its request's end: a.json's plot peaked at
    # 4,872.5 tok/s where 1,642.8 tok/s streamed (and the engine's fastest iteration was 3,223).
    end = interactive.TIME_BINS * BIN_S
    one_a_bin = [BIN_S * (k + 0.5) for k in range(10)]  # bins 0-9, one token each
    # An HTTP request: events of 3 and 2 tokens, 6 output tokens (the one the events did not
    # carry counts at the last event, as RaggedTokens does), ending the run.
    events = _request(1, 1.0, [2.05, end], event_tokens=[3, 2], output_tokens=6)
    failed = _request(2, 0.0, [0.35, 0.45], error="boom")  # a failed request adds nothing
    plot = interactive.over_time([Labeled("r", _run([_request(0, 0.0, one_a_bin), events,
                                                     failed]))])
    rate = np.array(plot.figure["data"][0]["y"])
    expected = np.zeros(interactive.TIME_BINS)
    expected[:10] = 1 / BIN_S
    expected[20] = 3 / BIN_S
    expected[-1] = 3 / BIN_S
    assert rate == pytest.approx(expected)
    assert rate.sum() * BIN_S == pytest.approx(16)  # every completed request's output, once


def test_a_request_without_token_times_is_spread_from_its_first_token_to_its_last():
    # No --save-detailed: 10 tokens, the first at 0.05 s, the last at 0.95 s.
    r = {"id": 0, "prompt_tokens": 8, "output_tokens": 10, "intended_start_s": 0.0,
         "ttft_ms": 50.0, "e2el_ms": 950.0}
    last = _request(1, 0.0, [interactive.TIME_BINS * BIN_S])
    rate = np.array(interactive.over_time([Labeled("r", _run([r, last]))]).figure["data"][0]["y"])
    assert rate[:10] == pytest.approx([1 / BIN_S] * 10)


def _iterations(prefill: np.ndarray, kv_used: np.ndarray) -> list[dict]:
    return [{"index": i, "start_s": i * 0.01, "duration_s": 0.01,
             "num_prefill_tokens": int(p), "num_decode_tokens": 32, "token_budget": 2048,
             "kv_blocks_used": int(k), "kv_blocks_total": 1000}
            for i, (p, k) in enumerate(zip(prefill, kv_used))]


def test_per_iteration_plots_keep_every_peak():
    # 2,000 evenly spaced points of a run's iterations kept 64 of its 195 prefill iterations
    # (the tallest, 867 tokens, drawn as 771) and its KV peak at 0.7544% beside a stored 0.7563%.
    n = 9_973  # not a multiple of the buckets
    rng = np.random.default_rng(0)
    prefill = np.zeros(n, dtype=np.int64)
    spikes = np.arange(7, n, 53)  # isolated prefill iterations, over 5 buckets apart
    prefill[spikes] = rng.integers(1, 900, len(spikes))
    kv = np.round(400 + 300 * np.sin(np.arange(n) / 700) + rng.integers(0, 40, n))
    run = {"schema_version": 1, "config": {}, "summary": {},
           "iterations": _iterations(prefill, kv)}
    t = np.arange(n) * 0.01
    budget = interactive.token_budget([Labeled("r", run)]).figure["data"][0]
    assert len(budget["x"]) <= interactive.MAX_POINTS
    assert budget["x"] == sorted(budget["x"]) and budget["x"][-1] == t[-1]
    assert max(budget["y"]) == prefill.max()
    drawn = dict(zip(np.round(budget["x"], 6), budget["y"]))
    assert all(drawn.get(round(float(t[i]), 6)) == prefill[i] for i in spikes)
    share = interactive.kv_usage([Labeled("r", run)]).figure["data"][0]["y"]
    assert max(share) == kv.max() / 1000 and min(share) == kv.min() / 1000
    # Any series: each bucket's highest and lowest point is drawn, at its own time.
    y = rng.standard_normal(n)
    xs, ys = interactive._thin(t, y)
    kept = dict(zip(np.round(xs, 6), ys))
    edges = np.linspace(0, n, interactive.MAX_POINTS // 2 + 1).round().astype(int)
    for bucket in (np.arange(a, b) for a, b in zip(edges[:-1], edges[1:])):
        for i in (bucket[np.argmax(y[bucket])], bucket[np.argmin(y[bucket])]):
            assert kept[round(float(t[i]), 6)] == y[i]
    # A line short enough is drawn whole.
    assert interactive._thin(t[:50], y[:50]) == (t[:50].tolist(), y[:50].tolist())
