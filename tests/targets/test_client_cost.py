"""The client's calibration of its own per-request cost (cbbench/distributed/client_cost.py):
a schedule one process cannot keep is said before the run starts, and `--workers auto`
takes as many processes as the schedule needs, at most the cores it may use (issue 41)."""

from __future__ import annotations

import numpy as np
from fake_openai import endpoint_options, prompt_requests

from cbbench.distributed import run as run_module
from cbbench.distributed.client_cost import (
    ONE_PROCESS_BUDGET_CORES,
    ClientCost,
    calibrate,
    schedule_rate,
)
from cbbench.distributed.plan import LoadPlan
from cbbench.distributed.run import run_load


def test_calibration_measures_this_process():
    cost = calibrate(16)
    # Positive and plausible for a Python client (microseconds, not seconds or nothing).
    assert 1e-6 < cost.request_s < 0.05 and 1e-7 < cost.read_s < 0.005
    assert cost.per_request_s == cost.request_s + 18 * cost.read_s
    assert cost.max_rate() == ONE_PROCESS_BUDGET_CORES / cost.per_request_s


def test_workers_for_a_rate():
    cost = ClientCost(request_s=0.0005, read_s=0.0, output_tokens=16)  # 0.5 ms a request
    assert cost.workers_for(1000, cores=16) == 1  # 0.5 cores: one process
    assert cost.workers_for(2000, cores=16) == 2  # 1.0 core: two within the budget
    assert cost.workers_for(10_000, cores=4) == 4  # never more than the cores it may use
    assert schedule_rate([0.0, 0.5, 1.0]) == 2.0 and schedule_rate([1.0]) == 0.0
    assert schedule_rate([0.0, 0.0]) == 0.0  # a burst has no rate to keep


def test_a_schedule_one_process_cannot_keep_is_said_before_it_starts(
        fresh_fake_server, notices, monkeypatch):
    said_before_sending = []

    def slow_client(tokens):  # as if this machine's client cost 2 ms a request
        said_before_sending.append(
            any("needs at least" in n for n in notices) or len(fresh_fake_server.requests))
        return ClientCost(request_s=0.002, read_s=0.0, output_tokens=tokens)

    monkeypatch.setattr(run_module, "calibrate", slow_client)
    n = 20
    run = run_load(endpoint_options(fresh_fake_server.url), prompt_requests(["x"] * n),
                   np.arange(n) / 1000.0, LoadPlan(1))  # 1000 req/s: 2 cores' worth
    warned = [m for m in notices if "needs at least" in m]
    assert len(warned) == 1 and "--workers" in warned[0] and "1000 req/s" in warned[0]
    assert said_before_sending == [0]  # calibrated before any request went out
    assert run.info["client_calibration"]["us_per_request"] == 2000
    assert all(r.ok for r in run.records)


def test_a_slow_schedule_is_not_calibrated(fresh_fake_server, monkeypatch):
    def fail(tokens):
        raise AssertionError("calibrated a 100 req/s schedule")

    monkeypatch.setattr(run_module, "calibrate", fail)
    run = run_load(endpoint_options(fresh_fake_server.url), prompt_requests(["x"] * 5),
                   np.arange(5) / 100.0, LoadPlan(1))
    assert "client_calibration" not in run.info and all(r.ok for r in run.records)
