"""Cancellation as a load pattern (--cancel-rate, --cancel-after): which requests, when; counted
apart from completed and failed, out of the latency figures, in the work the server did; the
engine and `cbbench serve` free the KV blocks of what was cancelled."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from helpers import invoke_app, run_spec, sim_options, start_server

from cbbench.bench.runner import execute_run
from cbbench.cli.serve import build_serving_engine
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.cancel import CancelPlan, cancel_plan
from cbbench.load.delays import parse_delay
from cbbench.schema.run import RunResult
from cbbench.targets.options import EndpointOptions

SIM = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b")
METRICS_WAIT_S = 5.0


def _run(workload="sharegpt", **kw) -> RunResult:
    kw.setdefault("engine", SIM)
    return execute_run(run_spec(workload=workload, **kw))


# ---- the plan ---------------------------------------------------------------------------------
def test_plan_picks_its_share_the_same_way_every_time():
    plan = CancelPlan(0.3, parse_delay("exp:200", ""), seed=4)
    picked = [plan.cancel_after_s(i) for i in range(4000)]
    share = sum(p is not None for p in picked) / len(picked)
    assert share == pytest.approx(0.3, abs=0.03)
    assert picked == [plan.cancel_after_s(i) for i in range(4000)]
    delays = [p for p in picked if p is not None]
    assert sum(delays) / len(delays) == pytest.approx(0.2, rel=0.1)  # exp mean 200 ms
    assert all(CancelPlan(1.0, parse_delay("25", "")).cancel_after_s(i) == 0.025
               for i in range(50))
    assert all(CancelPlan(0.0, parse_delay("25", "")).cancel_after_s(i) is None
               for i in range(50))


@pytest.mark.parametrize("rate,after,match", [
    (0.5, None, "go together"), (None, "100", "go together"), (1.5, "100", "between 0 and 1"),
    (0.5, "later", "invalid --cancel-after"), (0.5, "exp:", "invalid --cancel-after"),
])
def test_plan_errors(rate, after, match):
    with pytest.raises(UsageError, match=match):
        cancel_plan(rate, after, 0)


# ---- the engine -------------------------------------------------------------------------------
def test_engine_cancels_apart_and_frees_its_blocks():
    n = 300
    result = _run(num_requests=n, request_rate=20.0, cancel_rate=0.4,
                  cancel_after="exp:400")
    s, reqs = result.summary, result.requests
    cancelled = [r for r in reqs if r.cancelled]
    assert s.cancelled == len(cancelled) > 0
    assert s.completed + s.cancelled == n and s.failed == 0
    # Out of every latency figure, in the work done.
    assert s.ttft_ms.count == s.completed
    assert all(r.ttft_ms is None and r.error is None for r in cancelled)
    assert s.cancelled_work["output_tokens"] == sum(r.output_tokens for r in cancelled)
    assert s.cancelled_work["prompt_tokens"] == sum(r.prompt_tokens for r in cancelled)
    assert s.total_output_tokens == sum(r.output_tokens for r in reqs if not r.cancelled)
    assert s.engine.kv_blocks_in_use_at_end == 0
    assert result.config.cancel_rate == 0.4 and result.config.cancel_after == "exp:400"


def test_cancel_lands_at_its_time():
    plan = CancelPlan(0.5, parse_delay("150", ""))
    result = _run(num_requests=60, request_rate=10.0, arrival="constant",
                  cancel_rate=0.5, cancel_after="150", save_detailed=True)
    assert 0 < result.summary.cancelled < 30
    for r in result.requests:
        delay = plan.cancel_after_s(r.id)
        if r.cancelled:
            assert delay == 0.15
            # Aborted between iterations, at the first one ending at or after its time.
            assert all(t < r.intended_start_s + delay for t in r.token_times_s[:-1])
        elif delay is not None:  # picked, but finished first (in the iteration under way)
            assert all(t < r.intended_start_s + delay for t in r.token_times_s[:-1])


def test_cancel_everything_with_prefix_caching_leaves_nothing_held():
    engine = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", enable_prefix_caching=True)
    # 5 ms: mid-prefill or early decode, the shared blocks held by several requests at once.
    result = _run("shared-prefix", num_requests=80, engine=engine, cancel_rate=1.0,
                  cancel_after="5")
    s = result.summary
    assert s.cancelled == 80 and s.completed == 0
    assert s.engine.kv_blocks_in_use_at_end == 0


def test_a_cancelled_turn_does_not_end_its_session():
    result = _run("sharegpt-multiturn", num_requests=30, request_rate=2.0,
                  cancel_rate=0.3, cancel_after="exp:300")
    s = result.summary
    assert s.cancelled > 0 and s.failed == 0
    assert s.sessions.turns_sent == s.sessions.turns_planned
    assert s.completed + s.cancelled == s.sessions.turns_planned
    assert s.engine.kv_blocks_in_use_at_end == 0


# ---- cbbench serve ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def srv():
    run = start_server(lambda: build_serving_engine(sim_options()))
    yield run
    run.stop()


def _metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("cbbench_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _long_requests_cancelled(srv, tmp_path, n: int, rate: float, cancel_rate: float,
                             cancel_after: str):
    """``n`` requests of 64 prompt and 300 output tokens against ``srv``, --cancel-rate and
    --cancel-after as given."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"prompt_len": 64, "output_len": 300}) + "\n"
                            for _ in range(n)))
    return execute_run(run_spec(
        workload=str(path), num_requests=None, request_rate=rate,
        endpoint=EndpointOptions(endpoint=srv.url, request_timeout_s=60.0),
        cancel_rate=cancel_rate, cancel_after=cancel_after,
    ))


def test_serve_frees_what_the_client_cancelled(srv, tmp_path):
    aborted_before = _metrics(srv.url).get("cbbench_requests_aborted_total", 0.0)
    result = _long_requests_cancelled(srv, tmp_path, 40, 100.0, 0.5, "40")
    s = result.summary
    assert s.cancelled > 0 and s.failed == 0
    assert s.completed + s.cancelled == 40
    assert s.ttft_ms.count == s.completed
    # The server noticed every closed stream: nothing runs, no KV block is held.
    deadline = time.monotonic() + METRICS_WAIT_S
    while True:
        m = _metrics(srv.url)
        idle = (m["cbbench_num_requests_running"], m["cbbench_num_requests_waiting"],
                m["cbbench_kv_cache_blocks_used"]) == (0.0, 0.0, 0.0)
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert idle, m
    assert m["cbbench_requests_aborted_total"] - aborted_before >= 1


def test_cancel_after_zero_sends_each_request_before_it_closes(srv, tmp_path):
    """AIPerf's --request-cancellation-delay 0: the request fully sent, then the disconnect.
    The delay ran from the task's start, so every stream closed before its request was
    written: the server saw none of the 10, and the run reported 10 cancelled."""
    aborted_before = _metrics(srv.url).get("cbbench_requests_aborted_total", 0.0)
    result = _long_requests_cancelled(srv, tmp_path, 10, 50.0, 1.0, "0")
    assert result.summary.cancelled == 10
    deadline = time.monotonic() + METRICS_WAIT_S
    while True:
        aborted = _metrics(srv.url)["cbbench_requests_aborted_total"] - aborted_before
        if aborted == 10 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert aborted == 10


def test_cli_flags(tmp_path):
    res = invoke_app(["run", "--engine", "sim", "--num-requests", "5",
                      "--cancel-rate", "0.5", "--output", str(tmp_path / "r.json")])
    assert res.exit_code == 2
    assert res.output.strip() == "cbbench: error: --cancel-rate and --cancel-after go together"
    out = tmp_path / "ok.json"
    res = invoke_app(["run", "--engine", "sim", "--num-requests", "50",
                      "--request-rate", "10", "--cancel-rate", "0.5",
                      "--cancel-after", "exp:200", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "cancelled" in res.output
