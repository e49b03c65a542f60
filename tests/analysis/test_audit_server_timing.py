"""`cbbench audit` holds the server timings a result recorded from its responses (vLLM's
per-request `metrics`, as cbbench run or an imported vLLM bench file keeps them) to the request
log's: hand-made result and log, errors computed here; shown, never gating; absent when the
result recorded none."""

from __future__ import annotations

import pytest

from cbbench.analysis.server_side import audit as A

T0 = 1000.0  # the run's zero on the epoch
# One request: sent at 0.010 s, events at 0.050 (2 tokens) and 0.060 (1 token).
REQUEST = {"id": 0, "send_s": 0.010, "token_times_s": [0.050, 0.060], "event_tokens": [2, 1],
           "output_tokens": 3, "error": None, "server_request_id": "chatcmpl-1",
           "server_timing": {"queue_time_ms": 5.0, "time_to_first_token_ms": 20.0,
                             "generation_time_ms": 9.0}}
LINE = {"id": "chatcmpl-1", "status": 200, "finish": "length", "arrival": T0 + 0.012,
        "submitted": T0 + 0.013, "queue_exit": T0 + 0.018, "first_token": T0 + 0.0395,
        "last_token": T0 + 0.0495, "output_tokens": 3,
        "events": [[T0 + 0.0496, 2, "answer"], [T0 + 0.0596, 1, "answer"]]}


def _result(**request) -> dict:
    return {"summary": {"http": {"t0_epoch_s": T0}}, "requests": [{**REQUEST, **request}]}


def test_recorded_server_timings_are_held_to_the_log():
    rep = A.audit(_result(), {LINE["id"]: LINE})
    m = rep["metrics"]
    # The log: queue 18 - 13 = 5 ms, prefill 39.5 - 18 = 21.5 ms, decode 49.5 - 39.5 = 10 ms.
    assert m["server_queue_ms"]["median"] == pytest.approx(0.0, abs=1e-9)
    assert m["server_prefill_ms"]["median"] == pytest.approx(20.0 - 21.5)
    assert m["server_decode_ms"]["median"] == pytest.approx(9.0 - 10.0)
    assert all(not m[k]["gated"] for k in A.SERVER_TIMING_METRICS)
    # Shown, not gated: a 1.5 ms prefill difference fails nothing (TTFT etc. are within 2 ms).
    assert rep["passed"], {k: v for k, v in m.items() if not v["passed"]}


def test_a_result_without_server_timings_has_no_such_rows():
    rep = A.audit(_result(server_timing=None), {LINE["id"]: LINE})
    assert not set(A.SERVER_TIMING_METRICS) & set(rep["metrics"])
    assert "ttft_ms" in rep["metrics"]


def test_the_logs_queue_starts_at_admitted():
    # vLLM's queue time (and cbbench serve's queue_time_ms) starts at the scheduler's QUEUED
    # event, the log's `admitted`; the hand-over before it (13 -> 16 ms: the step in flight)
    # is not queueing. Response 2 ms = log 18 - 16: no difference.
    rep = A.audit(_result(server_timing={"queue_time_ms": 2.0, "time_to_first_token_ms": 21.5,
                                         "generation_time_ms": 10.0}),
                  {LINE["id"]: {**LINE, "admitted": T0 + 0.016}})
    assert rep["metrics"]["server_queue_ms"]["median"] == pytest.approx(0.0, abs=1e-9)
