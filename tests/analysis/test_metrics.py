"""Metrics with vLLM's definitions, checked on hand-computed records.

Three completed requests and two failed ones, with known token times (seconds):

  A: start 0.0, sent 0.0,  tokens 0.10 0.15 0.25 0.30  -> TTFT 100, E2EL 300, TPOT 200/3, ITL 50 100 50
  B: start 0.2, sent 0.2,  tokens 0.50                 -> TTFT 300, E2EL 300, no TPOT, no ITL
  C: start 0.3, sent 0.35, tokens 0.40 0.60 0.70       -> TTFT 100, E2EL 400, TPOT 150, ITL 200 100
  D: rejected, no tokens, sent 0.45
  E: aborted after one token (excluded from latency, counted as failed)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.columns import request_columns
from cbbench.analysis.summary.metrics import (
    distribution,
    meets_slo,
    parse_slo,
    summarize,
    summarize_engine,
)
from cbbench.errors import UsageError


def _records() -> list[RequestRecord]:
    return [
        RequestRecord(0, 10, 4, 0.0, send_s=0.0, token_times_s=[0.10, 0.15, 0.25, 0.30]),
        RequestRecord(1, 20, 1, 0.2, send_s=0.2, token_times_s=[0.50]),
        RequestRecord(2, 30, 3, 0.3, send_s=0.35, token_times_s=[0.40, 0.60, 0.70]),
        RequestRecord(3, 40, 0, 0.4, send_s=0.45, error="too long", error_type="rejected"),
        RequestRecord(4, 50, 1, 0.5, token_times_s=[0.9], error="aborted", error_type="aborted"),
    ]


def _approx_dist(d: dict, values: list[float]) -> None:
    a = np.asarray(values, dtype=float)
    assert d["count"] == a.size
    assert d["mean"] == pytest.approx(a.mean())
    assert d["std"] == pytest.approx(a.std())
    for p in (50, 90, 95, 99):
        assert d[f"p{p}"] == pytest.approx(np.percentile(a, p))


# ---- per-request values ---------------------------------------------------------------------
def test_per_request_values_by_hand():
    a, b, c, d, e = _records()
    assert a.ttft_s == pytest.approx(0.100)
    assert a.e2el_s == pytest.approx(0.300)
    assert a.tpot_s == pytest.approx((0.300 - 0.100) / 3)
    assert b.ttft_s == pytest.approx(0.300) and b.e2el_s == pytest.approx(0.300)
    assert b.tpot_s is None  # one output token: no TPOT
    assert c.ttft_s == pytest.approx(0.100)  # from the intended start, not the send
    assert c.e2el_s == pytest.approx(0.400)
    assert c.tpot_s == pytest.approx(0.150)
    for failed in (d, e):
        assert not failed.ok
        assert failed.ttft_s is None and failed.tpot_s is None and failed.e2el_s is None


def test_summary_by_hand():
    s = summarize(_records(), duration_s=1.0)
    assert s["completed"] == 3
    assert s["failed"] == 2
    assert s["error_types"] == {"rejected": 1, "aborted": 1}
    assert s["duration_s"] == 1.0
    assert s["total_input_tokens"] == 60  # completed only
    assert s["total_output_tokens"] == 8
    assert s["request_throughput"] == pytest.approx(3.0)
    assert s["output_throughput"] == pytest.approx(8.0)
    assert s["total_token_throughput"] == pytest.approx(68.0)
    _approx_dist(s["ttft_ms"], [100, 300, 100])
    _approx_dist(s["tpot_ms"], [200 / 3, 150])
    _approx_dist(s["itl_ms"], [50, 100, 50, 200, 100])  # pooled over requests
    _approx_dist(s["e2el_ms"], [300, 300, 400])
    _approx_dist(s["send_lag_ms"], [0, 0, 50, 50])  # every sent request, failed ones too
    assert s["ttft_ms"]["mean"] == pytest.approx(500 / 3)
    assert s["ttft_ms"]["p50"] == pytest.approx(100)
    assert s["e2el_ms"]["p90"] == pytest.approx(380)  # 300 + 0.8 * (400 - 300)
    assert s["itl_ms"]["p50"] == pytest.approx(100)
    assert "goodput" not in s and "slo" not in s


def test_throughput_scales_with_duration():
    s = summarize(_records(), duration_s=4.0)
    assert s["request_throughput"] == pytest.approx(0.75)
    assert s["output_throughput"] == pytest.approx(2.0)
    assert s["total_token_throughput"] == pytest.approx(17.0)


@pytest.mark.parametrize(
    ("slo", "good"),
    [
        ({"tpot": 100.0}, 2),  # A (66.7) and B (one token: no TPOT, passes); C (150) fails
        ({"ttft": 200.0}, 2),  # A, C; B's 300 fails
        ({"ttft": 200.0, "tpot": 100.0}, 1),  # A only
        ({"e2el": 350.0}, 2),  # A, B; C's 400 fails
        ({"e2el": 1000.0, "ttft": 1000.0, "tpot": 1000.0}, 3),  # failed ones never count
        ({"ttft": 50.0}, 0),
    ],
)
def test_goodput_by_hand(slo, good):
    s = summarize(_records(), duration_s=2.0, slo=slo)
    assert s["slo"] == slo
    assert s["goodput"] == pytest.approx(good / 2.0)
    assert s["slo_attainment"] == pytest.approx(good / 5)  # over every request, failed too
    assert s["slo_attainment"] == good / 5  # (no request cancelled: the ratio as it always was)


def test_slo_attainment_leaves_cancelled_requests_out_as_gate_sweep_and_capacity_read_it():
    """Cancelled requests are neither completed nor failed: out of the attainment's
    denominator. The summary's figure (gate's) and run_attainment's (sweep's and capacity's)
    are one number."""
    from cbbench.analysis.summary.slo import request_meets, run_attainment
    from cbbench.bench.runner import request_record_dict

    # 8 completed requests, TTFT 10 ms each, and 2 the client cancelled after one token.
    ok = [RequestRecord(i, 10, 3, 0.0, token_times_s=[0.01, 0.02, 0.03]) for i in range(8)]
    gone = [RequestRecord(8 + i, 10, 1, 0.0, token_times_s=[0.01], cancelled=True)
            for i in range(2)]
    s = summarize(ok + gone, 1.0, slo={"ttft": 100.0})
    assert (s["completed"], s["failed"], s["cancelled"]) == (8, 0, 2)
    assert s["goodput"] == 8.0
    assert s["slo_attainment"] == 1.0  # 8 / 8 (it was 8 / 10 = 0.8)
    # Add the five of _records(): A and C meet ttft <= 200 (B's 300 misses), D and E failed
    # (misses, in the denominator): 8 + 2 good of 8 + 5 judged; the 2 cancelled out.
    recs = ok + gone + _records()
    s = summarize(recs, 1.0, slo={"ttft": 200.0})
    assert s["slo_attainment"] == 10 / 13  # it was 10 / 15
    rows = [request_record_dict(r, False) for r in recs]
    assert not any(request_meets(r, {"ttft": 200.0}) for r in rows[8:10])
    assert run_attainment({"requests": rows}, {"ttft": 200.0}) == 10 / 13
    from cbbench.analysis.summary.slo import attainment  # the one rule both call

    assert attainment([], []) == 0.0 and attainment([False], [True]) == 0.0


def test_a_run_with_cancels_whose_completed_requests_all_meet_the_slo_attains_it():
    """`cbbench run --engine sim ... --cancel-rate 0.5 --cancel-after 40 --slo
    ttft=10000,e2el=100000`: every completed request meets limits this loose, so the run's
    attainment is 1.0 (it was 0.7: the cancels counted as misses), in the summary and in the
    probe point sweep and capacity read."""
    from helpers import run_spec

    from cbbench.analysis.summary.slo import parse_attainment_slo, run_attainment
    from cbbench.bench.probe import summarize_probe
    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    slo = {"ttft": 10000.0, "e2el": 100000.0}
    result = execute_run(run_spec(
        workload="random", input_len=64, output_len=50, num_requests=20, request_rate=50.0,
        cancel_rate=0.5, cancel_after="40", slo=slo,
        engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b")))
    s = result.summary
    assert s.cancelled > 0 and s.completed + s.failed + s.cancelled == 20
    assert max(r.e2el_ms for r in result.requests if r.e2el_ms is not None) < 10000
    assert s.slo_attainment == 1.0
    assert run_attainment(result, slo) == 1.0
    point = summarize_probe(50.0, result, parse_attainment_slo("ttft=10000,e2el=100000"))
    assert point.slo_attainment == 1.0


def _closed_loop(capped: bool) -> list[RequestRecord]:
    """Four requests all intended at t=0 behind --max-concurrency 1: each gets its slot when
    the one before ends (0, 0.1, 0.2, 0.3 s) and is sent then; its first token 20 ms and its
    last 80 ms after the send. ``capped`` False: the same times with no slot (an open loop
    whose client fell behind), whose latencies count from the intended start."""
    out = []
    for i in range(4):
        send = 0.1 * i
        out.append(RequestRecord(i, 10, 3, 0.0, send_s=send, slot_s=send if capped else None,
                                 token_times_s=[send + 0.02, send + 0.05, send + 0.08]))
    return out


def test_goodput_under_max_concurrency_is_judged_from_the_send():
    """`run --endpoint ... --max-concurrency 8 --slo ttft=21,tpot=5.2` against a server of TTFT
    20 ms read goodput 0.00 and attainment 0.0% beside "TTFT from send" p50 20.5: each request
    was judged on its TTFT from the intended start, the wait for a client slot included. Under
    the cap the SLO is judged from the send (vLLM's --goodput times TTFT inside its
    semaphore), in the summary and in run_attainment (sweep's and capacity's) alike; an open
    loop keeps the intended start."""
    from cbbench.analysis.summary.slo import run_attainment
    from cbbench.bench.runner import request_record_dict

    slo = {"ttft": 50.0, "e2el": 100.0, "tpot": 40.0}
    s = summarize(_closed_loop(True), 1.0, slo=slo)
    assert s["from_send"]["ttft_ms"]["p99"] == pytest.approx(20.0)
    assert s["ttft_ms"]["p99"] > 300  # the table's basis is unchanged
    assert s["slo_attainment"] == 1.0 and s["goodput"] == 4.0  # was 0.25 and 1.0
    assert s["slo_basis"] == "send" and s["latency_basis"] == "intended_start"
    rows = [request_record_dict(r, False) for r in _closed_loop(True)]
    assert [r["e2el_from_send_ms"] for r in rows] == pytest.approx([80.0] * 4)
    assert run_attainment({"requests": rows}, slo) == 1.0  # was 0.25
    detailed = [request_record_dict(r, True) for r in _closed_loop(True)]
    assert run_attainment({"requests": detailed}, slo) == 1.0
    # An older result's capped requests with no e2el_from_send_ms: E2EL from the TTFTs.
    old = [{k: v for k, v in r.items() if k != "e2el_from_send_ms"} for r in rows]
    assert run_attainment({"requests": old}, slo) == 1.0
    assert run_attainment({"requests": old}, {"e2el": 79.0}) == 0.0
    # Open loop: the intended start (no coordinated omission); only the first request meets.
    s = summarize(_closed_loop(False), 1.0, slo=slo)
    assert s["slo_attainment"] == 0.25 and "slo_basis" not in s
    rows = [request_record_dict(r, False) for r in _closed_loop(False)]
    assert run_attainment({"requests": rows}, slo) == 0.25


def test_one_token_request_passes_a_tpot_slo():
    cols = request_columns(_records())
    assert meets_slo(cols, {"tpot": 0.001})[1]
    assert not meets_slo(cols, {"tpot": 0.001, "ttft": 10.0})[1]
    assert not meets_slo(cols, {})[3]  # a failed request never meets an SLO


def test_empty_and_all_failed():
    s = summarize([], duration_s=0.0, slo={"ttft": 1.0})
    assert s["completed"] == 0 and s["failed"] == 0
    assert s["request_throughput"] == 0.0 and s["output_throughput"] == 0.0
    assert s["ttft_ms"] == {"mean": None, "std": None, "p50": None, "p90": None, "p95": None,
                            "p99": None, "count": 0}
    assert s["goodput"] == 0.0 and s["slo_attainment"] == 0.0
    failed = _records()[3:]
    s = summarize(failed, duration_s=1.0)
    assert s["completed"] == 0 and s["failed"] == 2
    assert s["ttft_ms"]["count"] == 0 and s["itl_ms"]["count"] == 0


# ---- distributions --------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200))
def test_distribution_matches_numpy_linear_percentiles(values):
    d = distribution(values)
    a = np.asarray(values)
    assert d["count"] == len(values)
    assert d["mean"] == pytest.approx(float(np.mean(a)), rel=1e-9, abs=1e-9)
    assert d["std"] == pytest.approx(float(np.std(a)), rel=1e-9, abs=1e-6)
    for p in (50, 90, 95, 99):
        assert d[f"p{p}"] == pytest.approx(float(np.percentile(a, p, method="linear")))


def test_distribution_custom_percentiles():
    d = distribution([1.0, 2.0, 3.0, 4.0], percentiles=(25, 75))
    assert d == {"mean": 2.5, "std": pytest.approx(np.std([1, 2, 3, 4])), "p25": 1.75,
                 "p75": 3.25, "count": 4}


def test_summarize_engine_by_hand():
    its = [
        dict(num_prefill_tokens=100, num_decode_tokens=0, token_budget=200, kv_blocks_used=10,
             kv_blocks_total=100, start_s=0.0, duration_s=0.01, bytes_moved=1e9, num_running=1,
             num_preempted=0),
        dict(num_prefill_tokens=0, num_decode_tokens=2, token_budget=200, kv_blocks_used=30,
             kv_blocks_total=100, start_s=0.01, duration_s=0.03, bytes_moved=3e9, num_running=2,
             num_preempted=1),
    ]
    e = summarize_engine(its)
    assert e["num_iterations"] == 2
    assert e["busy_time_s"] == pytest.approx(0.04)
    assert e["mean_iteration_ms"] == pytest.approx(20.0)
    assert e["mean_prefill_tokens"] == 50 and e["mean_decode_tokens"] == 1
    assert e["token_budget_utilization"] == pytest.approx((0.5 + 0.01) / 2)
    # Gauges (vLLM's num_requests_running, kv_cache_usage_perc) averaged over busy time, as a
    # scrape or the steady-state level reads them: the 30 ms step weighs three times the 10 ms
    # one (a plain mean per step: 0.2 and 1.5).
    assert e["peak_kv_usage"] == pytest.approx(0.3)
    assert e["mean_kv_usage"] == pytest.approx((0.1 * 0.01 + 0.3 * 0.03) / 0.04)  # 0.25
    assert e["mean_running"] == pytest.approx((1 * 0.01 + 2 * 0.03) / 0.04)  # 1.75
    assert e["num_preemptions"] == 1
    assert e["mean_achieved_bw_gbps"] == pytest.approx(100.0)  # 4e9 B / 0.04 s
    assert summarize_engine([]) == {"num_iterations": 0}


# ---- SLO parsing ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft=500,tpot=50", {"ttft": 500.0, "tpot": 50.0}),
        ("e2el=10000", {"e2el": 10000.0}),
        ("ttft=0.5, tpot = 20", {"ttft": 0.5, "tpot": 20.0}),
        ("ttft=1e3", {"ttft": 1000.0}),
        ("", {}),
        (None, {}),
    ],
)
def test_parse_slo_accepts(text, expected):
    assert parse_slo(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttfb=500", "invalid SLO"),  # unknown key
        ("ttft", "invalid SLO"),  # no value
        ("ttft:500", "invalid SLO"),
        ("ttft=abc", "milliseconds expected"),
        ("ttft=", "milliseconds expected"),
        ("ttft=-5", "must be > 0"),
        ("ttft=0", "must be > 0"),
        ("ttft=nan", "must be > 0"),
        ("ttft_p99=500", "sets an attainment"),  # one grammar; goodput refuses the suffix
        ("ttft=500,", "invalid SLO"),  # trailing empty part
        ("ttft=500,foo=1", "invalid SLO"),
    ],
)
def test_parse_slo_rejects(text, message):
    with pytest.raises(UsageError, match=message):
        parse_slo(text)
