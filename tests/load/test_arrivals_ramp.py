"""--duration and --ramp: arrival schedules bound by time, and linear rate ramps drawn by
inverting the integrated rate (hand-computed cases and statistical checks)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import invoke_app

from cbbench.errors import UsageError
from cbbench.load.arrivals import (
    Ramp,
    arrival_times,
    count_within,
    parse_duration,
    parse_ramp,
)
from cbbench.load.workload_types import WorkloadRequest


def _reqs(n: int, arrivals: list[float] | None = None) -> list[WorkloadRequest]:
    return [
        WorkloadRequest(i, 10, 5, arrival_s=None if arrivals is None else arrivals[i])
        for i in range(n)
    ]


# ---- parsing --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, seconds",
    [("60s", 60.0), ("90", 90.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), ("1.5s", 1.5)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "0s", "-3s", "2x", "s", "inf", "nan", "40d", "1e9h"])
def test_parse_duration_rejects(text):
    with pytest.raises(UsageError, match="--duration"):
        parse_duration(text)


def test_parse_ramp():
    assert parse_ramp("10:200:60") == Ramp(10.0, 200.0, 60.0)
    assert parse_ramp("0:5.5:2") == Ramp(0.0, 5.5, 2.0)


@pytest.mark.parametrize(
    "text", ["10:20", "a:b:c", "0:0:5", "-1:5:5", "1:5:0", "1:inf:5", "1:2:3:4"]
)
def test_parse_ramp_rejects(text):
    with pytest.raises(UsageError, match="--ramp"):
        parse_ramp(text)


# ---- the ramp's integrated rate and its inverse ---------------------------------------------
def test_ramp_from_zero_by_hand():
    # r(t) = t (0 -> 10 req/s over 10 s): L(t) = t^2 / 2, so the k-th constant arrival (L = k)
    # is at sqrt(2k); after 10 s the rate holds at 10: t = 10 + (k - 50) / 10.
    ramp = Ramp(0.0, 10.0, 10.0)
    t = arrival_times(_reqs(61), math.inf, 1.0, "constant", seed=0, ramp=ramp)
    expected = [math.sqrt(2 * k) for k in range(51)] + [10 + (k - 50) / 10 for k in range(51, 61)]
    assert t == pytest.approx(expected, abs=1e-12)


def test_ramp_down_by_hand():
    # r(t) = 4 - t over 4 s: L(t) = 4t - t^2/2, L(4) = 8; L^-1(k) = 4 - sqrt(16 - 2k).
    ramp = Ramp(4.0, 0.0, 4.0)
    t = arrival_times(_reqs(9), math.inf, 1.0, "constant", seed=0, ramp=ramp)
    assert t == pytest.approx([4 - math.sqrt(16 - 2 * k) for k in range(9)], abs=1e-12)
    with pytest.raises(UsageError, match="falls to 0"):
        arrival_times(_reqs(10), math.inf, 1.0, "constant", seed=0, ramp=ramp)
    # Time-bound, it simply ends: the 9 arrivals (the last at exactly 4 s) before 5 s.
    assert count_within(5.0, math.inf, 1.0, "constant", 0, ramp) == 9


def test_flat_ramp_is_the_constant_rate():
    ramp = Ramp(8.0, 8.0, 3.0)
    for process in ("constant", "gamma"):
        a = arrival_times(_reqs(500), math.inf, 2.0, process, seed=3, ramp=ramp)
        b = arrival_times(_reqs(500), 8.0, 2.0, process, seed=3)
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9)


def test_ramp_inverse_round_trips():
    for ramp in (Ramp(3.0, 50.0, 7.0), Ramp(50.0, 3.0, 7.0), Ramp(0.0, 1.0, 2.0)):
        t = np.linspace(0, 12, 241)
        assert ramp.time_of(ramp.expected(t)) == pytest.approx(t, abs=1e-9)


def test_poisson_ramp_follows_the_rate():
    # 20 -> 220 req/s over 10 s, Poisson: the count in each 1-s bin is Poisson with mean
    # L(b+1) - L(b) (30, 50, ..., 210); the sum of squared z-scores is chi-square with 10 degrees
    # of freedom, below 35 with probability ~0.9999 (a rate off by 10% would give ~60+).
    ramp = Ramp(20.0, 220.0, 10.0)
    n = count_within(10.0, math.inf, 1.0, "gamma", 11, ramp)
    t = arrival_times(_reqs(n), math.inf, 1.0, "gamma", seed=11, ramp=ramp)
    edges = np.arange(11.0)
    counts = np.histogram(t, edges)[0]
    mean = np.diff(ramp.expected(edges))
    assert mean == pytest.approx(np.arange(30, 230, 20))
    assert float(np.sum((counts - mean) ** 2 / mean)) < 35.0
    assert np.all(np.diff(t) >= 0) and t[0] == 0.0


# ---- --duration ------------------------------------------------------------------------------
@pytest.mark.parametrize("ramp", [None, Ramp(5.0, 60.0, 3.0)])
@pytest.mark.parametrize("process", ["constant", "gamma"])
def test_duration_keeps_exactly_the_arrivals_before_it(process, ramp):
    rate, d = 40.0, 4.0
    n = count_within(d, rate, 0.7, process, 2, ramp)
    t = arrival_times(_reqs(n + 1), rate, 0.7, process, seed=2, ramp=ramp)
    assert t[n - 1] < d <= t[n]
    # The time-bound schedule is the count-bound one with the same count, exactly.
    assert np.array_equal(arrival_times(_reqs(n), rate, 0.7, process, seed=2, ramp=ramp), t[:n])


def test_duration_at_rate_inf_is_refused():
    with pytest.raises(UsageError, match="finite --request-rate"):
        count_within(5.0, math.inf, 1.0, "gamma", 0)


def test_duration_cuts_a_trace():
    trace = _reqs(5, [10.0, 10.5, 11.0, 12.0, 13.0])
    assert count_within(2.0, math.inf, 1.0, "trace", 0, trace=trace) == 3
    assert count_within(99.0, math.inf, 1.0, "trace", 0, trace=trace) == 5


def test_ramp_refuses_a_trace():
    with pytest.raises(UsageError, match="trace"):
        arrival_times(_reqs(2, [0.0, 1.0]), math.inf, 1.0, "trace", 0, ramp=Ramp(1, 2, 3))


# ---- through the CLI (simulated engine: fast) ------------------------------------------------
def _run(tmp_path, *args):
    out = tmp_path / "r.json"
    res = invoke_app(
        ["run", "--engine", "sim", "--model", "llama-3-8b", "--output", str(out), *args]
    )
    return res, (json.loads(out.read_text()) if out.exists() else None)


def test_cli_duration_and_ramp(tmp_path):
    res, r = _run(tmp_path, "--duration", "2s", "--request-rate", "30", "--seed", "4")
    assert res.exit_code == 0, res.output
    n = r["config"]["num_requests"]
    assert r["config"]["duration_s"] == 2.0 and n == len(r["requests"])
    starts = sorted(q["intended_start_s"] for q in r["requests"])
    assert starts[-1] < 2.0 and n == count_within(2.0, 30.0, 1.0, "gamma", 4)

    res, r = _run(tmp_path, "--ramp", "10:90:2", "--arrival", "constant")
    assert res.exit_code == 0, res.output
    assert r["config"]["ramp"] == {"start_rate": 10.0, "end_rate": 90.0, "seconds": 2.0}
    assert r["config"]["request_rate"] is None
    # Constant arrivals under L(t) = 10t + 20t^2: L(2) = 100 -> arrivals k = 0..99.
    starts = sorted(q["intended_start_s"] for q in r["requests"])
    assert len(starts) == 100
    assert starts == pytest.approx([2 * k / (10 + math.sqrt(100 + 80 * k)) for k in range(100)])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--duration", "2s", "--num-requests", "5"], "give one"),
        (["--ramp", "1:2:3", "--request-rate", "5"], "drop --request-rate"),
        (["--duration", "soon"], "--duration"),
        (["--ramp", "1:2"], "--ramp"),
        (["--duration", "3s"], "finite --request-rate"),
    ],
)
def test_cli_bad_schedule_options(tmp_path, args, message):
    res, _ = _run(tmp_path, *args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
