"""The compact run's conversion to the summary's columns (analysis/compact/compact_summary.py)
and its rows (compact_rows.py) against the object path's on real simulated runs: each run is
made with run_engine, summarized by runner._summary (its records' columns), converted to a
CompactRun (compact_convert.py), its columns compared with the records' and summarized again
by the same _summary. The whole summary dict must be equal: exactly (==, key order too) everywhere except the mean and
std of the pooled per-token distributions (itl_ms, event_gap_ms, wherever they sit), which
are within 1e-9 relative (summation order; see compact_summary's module doc). Their count
and percentiles are exact."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math

import numpy as np
import pytest
from helpers import assert_same, run_spec

import cbbench.targets.engine as engine_target
from cbbench.analysis.compact.compact_convert import compact_from_engine_run
from cbbench.analysis.compact.compact_rows import compact_iteration_dicts, compact_request_dicts
from cbbench.analysis.compact.compact_summary import StepTokens, compact_columns
from cbbench.analysis.summary.columns import request_columns
from cbbench.bench.runner import RunSpec, _summary, plan_schedule, request_record_dict
from cbbench.engine.args import EngineArgs


def _run(spec: RunSpec, monkeypatch, edit=None, stop_after: int | None = None):
    """(object path's run, its summary, the CompactRun) for ``spec``; ``edit`` changes the
    scheduled requests (a rejected one, one-token ones, priorities)."""
    sched = plan_schedule(spec)
    if edit is not None:
        sched = dataclasses.replace(sched, wreqs=edit(list(sched.wreqs)))
    sets = []
    real = engine_target.build_replicas

    def capture(args):
        rs, info = real(args)
        sets.append(rs)
        return rs, info

    monkeypatch.setattr(engine_target, "build_replicas", capture)
    calls = [0]

    def should_stop() -> bool:  # after so many turns of the engine's loop: deterministic
        calls[0] += 1
        return stop_after is not None and calls[0] > stop_after

    run = engine_target.run_engine(spec.engine, sched.wreqs, sched.arrivals, should_stop)
    replica_of = sets[0].assignments if sets else None
    compact = compact_from_engine_run(run, replica_of)
    SCHEDULES[spec.output.label] = sched
    return run, _summary(spec, sched, run), compact


STOP_AFTER = {"interrupted": 20}  # turns of the engine's loop before the stop
SCHEDULES: dict = {}  # each case's schedule (its label), for the array simulator's run


def _engine(dp: int = 1, router: str = "round-robin") -> EngineArgs:
    return EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", data_parallel_size=dp,
                      router=router)


def _odd_requests(wreqs):
    """One request too long for the model's context (rejected at arrival), a few of one
    output token, two priority classes."""
    out = [dataclasses.replace(w, priority=i % 2) for i, w in enumerate(wreqs)]
    out[5] = dataclasses.replace(out[5], prompt_len=200_000)
    for i in (7, 8, 30):
        out[i] = dataclasses.replace(out[i], output_len=1)
    return out


CASES = {
    "dp1_odd": (dict(num_requests=300, request_rate=20.0), _engine(), _odd_requests),
    "dp4_rr_views": (
        dict(num_requests=1000, request_rate=100.0, slo="ttft=15,tpot=5",
             percentiles="50,99.9", slice="1.5s", warmup=1.0, cooldown=1.0),
        _engine(4, "round-robin"), None),
    "dp4_least_requests": (dict(num_requests=2000, request_rate=400.0, slice="2s"),
                           _engine(4, "least-requests"), _odd_requests),
    "burst_dp2": (dict(num_requests=400), _engine(2, "least-requests"), None),
    # Stopped midway: requests not sent, the queued ones aborted (failed: interrupted).
    # A queue (32 seats) that the stop cuts: the queued aborted, the last arrivals not sent.
    # (DP 1: under DP the object path's drain writes iteration records with no replica.)
    "interrupted": (dict(num_requests=600, request_rate=2000.0),
                    dataclasses.replace(_engine(), max_num_seqs=32), None),
    # Nothing runs: no iteration, no token (the in-flight steady state, no engine summary).
    "all_rejected": (dict(num_requests=5, request_rate=10.0), _engine(),
                     lambda ws: [dataclasses.replace(w, prompt_len=200_000) for w in ws]),
}


@functools.cache
def _built(name: str):
    fields, engine, edit = CASES[name]
    spec = run_spec(workload="sharegpt", seed=3, engine=engine, label=name, **fields)
    with pytest.MonkeyPatch.context() as mp:
        run, ref, compact = _run(spec, mp, edit, STOP_AFTER.get(name))
    return name, spec, run, ref, compact


@pytest.fixture(params=list(CASES))
def case(request):
    return _built(request.param)


def test_the_compact_summary_equals_the_object_paths(case):
    name, spec, run, ref, compact = case
    got = _summary(spec, SCHEDULES[name], compact)
    assert_same(got, ref)
    # What each case is there to exercise, shown to have happened.
    if name == "all_rejected":
        assert ref["failed"] == 5 and "engine" not in ref and not run.iterations
        assert ref["steady_state"]["method"] == "in_flight_requests"
        return
    assert ref["completed"] > 0 and ref["itl_ms"]["count"] > 1000
    if name == "interrupted":  # 435 sent: 39 completed, 396 aborted; 165 not sent
        assert run.interrupted and ref["not_sent"] > 0
        assert ref["error_types"].get("interrupted", 0) > 0
    if name.endswith("odd"):
        assert ref["failed"] == 1 and ref["error_types"] == {"rejected": 1}
        assert "per_priority" in ref and ref["tpot_ms"]["count"] < ref["completed"]
    if name == "dp4_rr_views":
        assert 0 < ref["goodput"] < ref["request_throughput"]
        assert "p99.9" in ref["itl_ms"] and len(ref["slices"]) > 3
        assert ref["steady_state"]["method"] == "warmup_cooldown"
    if name == "dp4_least_requests":
        assert ref["steady_state"]["method"] == "running_requests"
        assert ref["steady_state"]["window_s"] is not None
        assert {it["replica"] for it in run.iterations} == {0, 1, 2, 3}


# Every column of summary/columns.py's RequestColumns, the derived ones too.
COLUMNS = ("prompt_tokens", "output_tokens", "priority", "intended_start_s", "send_s", "slot_s",
           "first_token_s", "last_token_s", "failed", "cancelled", "max_tokens", "finish_stop",
           "finish_length", "ttfot_s", "reasoning_tokens", "turn", "has_tokens", "ok",
           "ttft_ms", "e2el_ms", "tpot_ms", "has_tpot", "start_s", "end_s", "served_s")


def test_both_conversions_give_the_same_columns(case):
    """The one summary reads columns: the records' (request_columns) and the compact run's
    (compact_columns) must be equal, every column exactly (NaN where both have none), and
    their token times must answer alike: the pooled gaps the same multiset, the same tokens
    in any window and slice."""
    _, _, run, _, compact = case
    want, got = request_columns(run.records), compact_columns(compact)
    for name in COLUMNS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert got.error_types == want.error_types
    ok = np.flatnonzero(want.ok)
    values, weights = got.tokens.pooled_gaps_ms(ok)
    expanded, none = want.tokens.pooled_gaps_ms(ok)
    assert weights is not None and none is None
    assert np.array_equal(np.sort(np.repeat(values, weights)), np.sort(expanded))
    end = float(np.nanmax(want.last_token_s)) if len(ok) else 1.0
    for a, b in ((0.0, end), (end / 3, end / 2), (end / 2, end / 2)):
        assert got.tokens.tokens_between(ok, a, b) == want.tokens.tokens_between(ok, a, b)
    bounds = np.linspace(0.0, end, 7)[1:-1]
    assert (got.tokens.slice_tokens(ok, bounds, 6) == want.tokens.slice_tokens(ok, bounds, 6)).all()
    assert int(got.tokens.slice_tokens(ok, bounds, 6).sum()) == int(want.output_tokens[ok].sum())


def test_request_rows_equal_the_object_paths(case):
    _, spec, run, _, compact = case
    for detailed in (False, True):
        got = list(compact_request_dicts(compact, detailed))
        want = [request_record_dict(r, detailed) for r in run.records]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w, f"request {w['id']}")


def test_iteration_rows_equal_the_object_paths(case):
    _, _, run, _, compact = case
    # run.iterations went through _summary: add_utilization gave them MBU and MFU.
    assert not run.iterations or "mbu" in run.iterations[0]
    assert_same(list(compact_iteration_dicts(compact)), run.iterations, "iterations")


def test_a_gap_in_a_requests_tokens_is_refused():
    run = _built("dp1_odd")[2]
    r = next(r for r in run.records if r.output_tokens > 10)
    gapped = dataclasses.replace(r, token_times_s=r.token_times_s[:3] + r.token_times_s[4:],
                                 output_tokens=r.output_tokens - 1)
    # The step it skipped stays in the replica's end times: another request had a token then.
    others = {t for o in run.records if o is not r for t in o.token_times_s}
    assert r.token_times_s[3] in others
    broken = dataclasses.replace(run, records=[gapped if o is r else o for o in run.records])
    with pytest.raises(ValueError, match="not consecutive steps"):
        compact_from_engine_run(broken)
    preempted = dataclasses.replace(run, records=[
        dataclasses.replace(o, num_preemptions=1) if o is r else o for o in run.records])
    with pytest.raises(ValueError, match="num_preemptions"):
        compact_from_engine_run(preempted)


def test_out_of_scope_runs_are_refused():
    _, spec, _, _, compact = _built("dp1_odd")
    with pytest.raises(ValueError, match="--cancel-rate"):
        _summary(spec.with_load(cancel_rate=0.1), SCHEDULES["dp1_odd"], compact)


def test_the_comparison_fails_where_it_should():
    """assert_same is strict where it says: one ulp off a percentile fails, a pooled mean
    1e-12 off passes and 1e-6 off fails, a key out of order fails."""
    _, spec, _, ref, compact = _built("dp1_odd")
    got = _summary(spec, SCHEDULES["dp1_odd"], compact)
    for path, change, fails in (
        (("itl_ms", "p50"), lambda v: math.nextafter(v, math.inf), True),
        (("ttft_ms", "mean"), lambda v: math.nextafter(v, math.inf), True),
        (("itl_ms", "mean"), lambda v: v * (1 + 1e-12), False),
        (("itl_ms", "mean"), lambda v: v * (1 + 1e-6), True),
    ):
        bent = copy.deepcopy(got)
        bent[path[0]][path[1]] = change(bent[path[0]][path[1]])
        if fails:
            with pytest.raises(AssertionError):
                assert_same(bent, ref)
        else:
            assert_same(bent, ref)
    reordered = {"failed": got["failed"], **got}
    with pytest.raises(AssertionError, match="keys"):
        assert_same(reordered, ref)


def test_weighted_pooling_counts_each_gap_once_per_request():
    """The coverage count by hand: two requests on one replica of 5 steps."""
    from cbbench.analysis.compact.compact_run import CompactRequests, CompactRun, StepTable

    ends = np.array([1.0, 2.0, 4.0, 7.0, 11.0])
    req = CompactRequests(
        id=np.array([0, 1]), prompt_tokens=np.array([3, 3]), output_tokens=np.array([3, 4]),
        max_tokens=np.array([3, 4]), arrival_s=np.array([0.0, 0.5]),
        first_scheduled_s=np.array([0.1, 0.6]), replica=np.array([0, 0]),
        first_step=np.array([0, 1]), priority=np.array([0, 0]))
    run = CompactRun(req, [ends], StepTable({"index": np.zeros(0)}), 11.0, False, None)
    gaps, weights = StepTokens(run).pooled_gaps_ms(np.array([0, 1]))
    # Request 0: gaps 1, 2 (ms x 1000); request 1: gaps 2, 3, 4.
    assert dict(zip(gaps.tolist(), weights.tolist())) == {1000.0: 1, 2000.0: 2, 3000.0: 1,
                                                          4000.0: 1}


def test_weighted_distribution_is_numpys_on_the_expanded_array():
    """Percentiles and count bit-identical to distribution(np.repeat(v, w)), for positive,
    negative (the argsort fallback), tied and zero values and zero weights; mean and std to
    1e-12. (A multiset of one repeated value is left out: numpy's pairwise mean of it can be
    an ulp off the value, making its std ~1e-15 where the weighted one is 0.)"""
    from cbbench.analysis.summary.metrics import distribution, weighted_distribution

    rng = np.random.default_rng(1)
    ps = (0, 1, 33.3, 50, 90, 95, 99, 99.9, 100)
    checked = 0
    for trial in range(300):
        k = int(rng.integers(2, 60))
        v = np.round(rng.exponential(1, k) * 10.0 ** rng.integers(-3, 3), int(rng.integers(1, 6)))
        v = -v if trial % 5 == 0 else v
        v[0], v[-1] = (0.0, -0.0) if trial % 7 == 0 else (v[0], v[-1])
        w = rng.integers(0, 40, k)
        e = np.repeat(v, w)
        if np.unique(e).size < 2:
            continue
        want, got = distribution(e, ps), weighted_distribution(v, w, ps)
        assert list(got) == list(want)
        for key in want:
            if key in ("mean", "std"):
                assert math.isclose(got[key], want[key], rel_tol=1e-12), (trial, key)
            else:
                assert type(got[key]) is type(want[key]) and got[key] == want[key], (trial, key)
        checked += 1
    assert checked > 250
    assert weighted_distribution(np.ones(3), np.zeros(3, dtype=np.int64)) == distribution([])


def test_weighted_histogram_and_running_order_are_the_expanded_ones():
    from cbbench.analysis.summary.histogram import log_histogram
    from cbbench.analysis.summary.steady_state import _stable_order

    rng = np.random.default_rng(2)
    for trial in range(100):
        k = int(rng.integers(0, 50))
        v = rng.exponential(1, k) * 10.0 ** rng.integers(-4, 3)
        if k and trial % 3 == 0:
            v[0] = np.inf
        w = rng.integers(0, 5, k)
        assert log_histogram(v, w) == log_histogram(np.repeat(v, w))
        running = rng.integers(0, 90, k).astype(np.float64)
        assert (_stable_order(running) == np.argsort(running, kind="stable")).all()
    fractional = np.array([2.0, 1.5, 2.0, 1.0])
    assert (_stable_order(fractional) == np.argsort(fractional, kind="stable")).all()


def test_engine_summary_of_one_value_columns_is_the_full_columns():
    """A StepTable column that holds one value may be a zero-stride view (compact_run.py):
    the engine summary of it equals that of the full column."""
    from cbbench.analysis.summary.metrics import summarize_engine_columns

    run = _built("dp4_least_requests")[4]
    cols = dict(run.steps.columns)
    assert len(np.unique(cols["token_budget"])) == len(np.unique(cols["kv_blocks_total"])) == 1
    viewed = dict(cols)
    for name in ("token_budget", "kv_blocks_total", "num_preempted", "swap_time_s"):
        viewed[name] = np.broadcast_to(cols[name][0], cols[name].shape)
    gpu = run.resolved.gpu_spec
    assert summarize_engine_columns(viewed, gpu) == summarize_engine_columns(cols, gpu)


def test_bounded_histogram_with_weights_is_the_expanded_one():
    """LogHistogram.add_many(values, weights): the buckets, zeros, count and so every
    percentile of the expanded array; mean and std to float rounding."""
    from cbbench.analysis.summary.histogram import LogHistogram

    rng = np.random.default_rng(3)
    v = np.concatenate((rng.exponential(10.0, 500), np.zeros(7)))
    w = rng.integers(0, 30, v.size)
    weighted, expanded = LogHistogram(), LogHistogram()
    weighted.add_many(v, w)
    expanded.add_many(np.repeat(v, w))
    assert weighted.buckets == expanded.buckets and weighted.zeros == expanded.zeros > 0
    got, want = weighted.distribution((50, 99)), expanded.distribution((50, 99))
    for key in want:
        if key in ("mean", "std"):
            assert math.isclose(got[key], want[key], rel_tol=1e-9)
        else:
            assert got[key] == want[key]
    with pytest.raises(ValueError, match="weights"):
        LogHistogram().add_many(v[:2], np.array([1, -1]))


@pytest.mark.parametrize("name", ["dp1_odd", "dp4_rr_views", "dp4_least_requests"])
def test_the_array_simulators_run_summarizes_as_the_object_run(name):
    """End to end: engine/sim/array_sim.py's own CompactRun (int32 step columns, every step
    in the end times, one-value columns as views) of the same requests gives the object
    path's summary, request rows and iteration rows."""
    from cbbench.targets.engine_compact import run_engine_compact

    _, spec, run, ref, _ = _built(name)
    sched = SCHEDULES[name]
    compact = run_engine_compact(spec.engine, sched.wreqs, sched.arrivals)
    assert compact is not None
    assert_same(_summary(spec, sched, compact), ref)
    view = compact.view  # the summary's columns, which the rows take too, as the runner does
    for detailed in (False, True):
        assert_same(list(compact_request_dicts(compact, detailed, view)),
                    [request_record_dict(r, detailed) for r in run.records], "requests")
    assert_same(list(compact_iteration_dicts(compact)), run.iterations, "iterations")
