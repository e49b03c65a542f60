"""Issue 27's TTFT breakdown against its truth, `cbbench serve --engine sim
--enable-per-request-metrics --request-log LOG`: at 50 req/s the parts of each request's TTFT
(send lag, the way in, queue, prefill, delivery) add up to the client's TTFT within 1 ms for
at least 99% of the requests, and the server's parts in its responses (vLLM's `metrics`)
equal those its request log gives; without the log the two trips are reported together; a
request whose parts do not add up is flagged, not forced (hand-made records).

`cbbench serve` is a real process (its log and its clock are the truth); `cbbench run` is the
console script's entry in this process (helpers.cli_in_process), as the same client code runs
in its own: a process around it only added ~1 CPU-s of start-up imports per case."""

from __future__ import annotations

import json

import pytest
from helpers import cli_in_process, serve_process

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.ttft_breakdown import (
    DEFAULT_TOLERANCE_MS,
    breakdown,
    request_parts,
)

RATE = 50
REQUESTS = 150
MS = 1000.0
PARTS = ("send_lag_ms", "network_in_ms", "server_queue_ms", "server_prefill_ms", "delivery_ms")
SERVER_ARGS = ("--engine", "sim", "--model", "llama-3-8b", "--gpu", "H200",
               "--enable-per-request-metrics")


def _run_against_serve(d, *run_args: str):
    log, res = d / "serve.jsonl", d / "run.json"
    with serve_process(*SERVER_ARGS, "--request-log", str(log)) as srv:
        out = cli_in_process(
            ["run", "--endpoint", srv.url, "--workload", "random",
             "--input-len", "200", "--output-len", "16",
             "--num-requests", str(REQUESTS), "--request-rate", str(RATE),
             "--server-log", str(log), "--output", str(res), *run_args],
        )
        assert out.returncode == 0, out.stdout + out.stderr
    lines = {x["id"]: x for x in map(json.loads, log.read_text().splitlines())}
    return json.loads(res.read_text()), lines, out.stdout


@pytest.fixture(scope="module")
def run_against_serve(tmp_path_factory):
    return _run_against_serve(tmp_path_factory.mktemp("ttft_parts"))


def test_parts_add_up_to_each_ttft(run_against_serve):
    result, _, table = run_against_serve
    done = [r for r in result["requests"] if r["error"] is None]
    assert len(done) == REQUESTS
    split = [r for r in done if r.get("ttft_parts")]
    assert len(split) == REQUESTS
    within = 0
    for r in split:
        p = r["ttft_parts"]
        assert p["source"] == "response+server_log"
        total = sum(p[k] for k in PARTS)
        within += abs(total - r["ttft_ms"]) <= 1.0 and all(p[k] >= -1.0 for k in PARTS)
        assert p["consistent"] == (abs(p["residual_ms"]) <= DEFAULT_TOLERANCE_MS
                                   and all(p[k] >= -DEFAULT_TOLERANCE_MS for k in PARTS))
    assert within >= 0.99 * len(split), f"{within} of {len(split)} add up within 1 ms"
    b = result["summary"]["ttft_breakdown"]
    assert b["requests"] == REQUESTS and b["flagged"] == len(split) - within
    # The shares are of the whole TTFT: they add up to 1 over the consistent requests.
    assert sum(b[k]["share"] for k in PARTS) == pytest.approx(1.0, abs=1e-3)
    assert "TTFT split" in table and "server prefill" in table


def test_server_parts_equal_its_request_log(run_against_serve):
    result, lines, _ = run_against_serve
    for r in result["requests"]:
        t, line = r["server_timing"], lines[r["server_request_id"]]
        # The log writes epoch seconds to the microsecond: 1e-3 ms apart at most.
        assert t["queue_time_ms"] == pytest.approx(
            (line["queue_exit"] - line["admitted"]) * MS, abs=2e-3)
        assert t["time_to_first_token_ms"] == pytest.approx(
            (line["first_token"] - line["queue_exit"]) * MS, abs=2e-3)
        assert t["generation_time_ms"] == pytest.approx(
            (line["last_token"] - line["first_token"]) * MS, abs=2e-3)
        assert r["ttft_parts"]["server_queue_ms"] == t["queue_time_ms"]
        e = r["e2el_parts"]
        assert sum(v for k, v in e.items() if k.endswith("_ms") and k != "residual_ms") \
            == pytest.approx(r["e2el_ms"], abs=1.0)


def test_the_split_holds_with_two_workers(tmp_path):
    """--workers 2: each worker process reads its own clock; the log's way in and delivery
    only come out non-negative, and the response's server parts equal the log's, when both
    workers' times are on the result's one clock."""
    result, lines, _ = _run_against_serve(tmp_path, "--workers", "2", "--quiet")
    done = [r for r in result["requests"] if r["error"] is None]
    assert len(done) == REQUESTS and {r["worker"] for r in done} == {0, 1}
    assert all(r["ttft_parts"]["source"] == "response+server_log" for r in done)
    sound = 0
    for r in done:
        p, line = r["ttft_parts"], lines[r["server_request_id"]]
        sound += (abs(sum(p[k] for k in PARTS) - r["ttft_ms"]) <= 1.0
                  and all(p[k] >= -1.0 for k in PARTS))
        assert p["server_queue_ms"] == pytest.approx(
            (line["queue_exit"] - line["admitted"]) * MS, abs=2e-3)
    assert sound >= 0.99 * len(done), f"{sound} of {len(done)} sound"
    b = result["summary"]["ttft_breakdown"]
    assert b["requests"] == REQUESTS and b["flagged"] == len(done) - sound


def _record(**kw) -> RequestRecord:
    base = dict(id=0, prompt_tokens=10, output_tokens=3, intended_start_s=1.0, send_s=1.002,
                token_times_s=[1.100, 1.110, 1.120], server_request_id="cmpl-1")
    return RequestRecord(**{**base, **kw})


T0 = 1000.0  # the run clock's zero on the epoch
LINE = {"submitted": T0 + 1.005, "queue_exit": T0 + 1.025, "first_token": T0 + 1.095,
        "last_token": T0 + 1.115}


def test_hand_computed_parts_from_the_log():
    ttft, e2el = request_parts(_record(), LINE, T0)
    assert ttft["send_lag_ms"] == pytest.approx(2.0)
    assert ttft["network_in_ms"] == pytest.approx(3.0)
    assert ttft["server_queue_ms"] == pytest.approx(20.0)
    assert ttft["server_prefill_ms"] == pytest.approx(70.0)
    assert ttft["delivery_ms"] == pytest.approx(5.0)
    assert ttft["source"] == "server_log" and ttft["consistent"]
    assert e2el["server_decode_ms"] == pytest.approx(20.0)
    assert e2el["delivery_ms"] == pytest.approx(5.0)


def test_response_timings_alone_leave_the_two_trips_together():
    rec = _record(server_timing={"queue_time_ms": 20.0, "time_to_first_token_ms": 70.0,
                                 "generation_time_ms": 20.0})
    ttft, _ = request_parts(rec, None, T0)
    assert ttft["source"] == "response"
    assert ttft["network_in_ms"] is None if "network_in_ms" in ttft else True
    assert ttft["network_ms"] == pytest.approx(100.0 - 2.0 - 20.0 - 70.0)
    assert ttft["consistent"]


def test_parts_that_do_not_add_up_are_flagged_not_forced():
    # The server says its prefill took 95 ms, but the client read the token 98 ms after it
    # sent: its log's clock and its response disagree by 6 ms.
    rec = _record(server_timing={"queue_time_ms": 20.0, "time_to_first_token_ms": 76.0,
                                 "generation_time_ms": 20.0})
    ttft, _ = request_parts(rec, LINE, T0)
    assert not ttft["consistent"]
    assert ttft["residual_ms"] == pytest.approx(-6.0)
    assert ttft["server_prefill_ms"] == 76.0  # as the server said, not adjusted
    good = _record(id=1, server_request_id="cmpl-2")
    good.ttft_parts, _ = request_parts(good, LINE, T0)
    rec.ttft_parts = ttft
    b = breakdown([rec, good], "ttft_parts", "ttft_s", PARTS)
    assert b["requests"] == 2 and b["flagged"] == 1
    assert b["server_prefill_ms"]["count"] == 1 and b["server_prefill_ms"]["mean"] == \
        pytest.approx(70.0)


def test_a_negative_remainder_without_the_log_is_flagged():
    rec = _record(server_timing={"queue_time_ms": 30.0, "time_to_first_token_ms": 75.0})
    ttft, e2el = request_parts(rec, None, T0)
    assert ttft["network_ms"] == pytest.approx(-7.0) and not ttft["consistent"]
    assert e2el is None  # no decode time: E2EL is not split


def test_a_server_log_path_that_does_not_exist_is_refused_before_the_run(tmp_path):
    out = cli_in_process(
        ["run", "--endpoint", "http://127.0.0.1:9", "--num-requests", "2",
         "--server-log", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "r.json")],
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"cbbench: error: --server-log {tmp_path / 'nope.jsonl'}: no such file (cbbench serve "
        "--request-log opens it at start-up)"]
    assert not (tmp_path / "r.json").exists()


def test_a_server_log_that_is_a_fifo_is_refused_before_the_run(tmp_path):
    """Issue 37, rule 4: whatever is wrong with --server-log now is refused now."""
    import os

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    out = cli_in_process(
        ["run", "--endpoint", "http://127.0.0.1:9", "--num-requests", "2",
         "--server-log", str(fifo), "--output", str(tmp_path / "r.json")],
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "is a FIFO, not a file" in out.stderr and not (tmp_path / "r.json").exists()


@pytest.fixture(scope="module")
def plain_serve():
    """`cbbench serve` without a request log, shared by the unreadable-log cases."""
    with serve_process(*SERVER_ARGS) as srv:
        yield srv


@pytest.mark.parametrize("content", [b'{"hello": 1}\n', b"\x89PNG\r\n\x1a\n\xff\xfe garbage\n"],
                         ids=["not-a-log", "binary"])
def test_an_unreadable_server_log_after_the_run_keeps_the_result(tmp_path, plain_serve, content):
    """The log is read once the run is measured: a file that is not a request log then costs
    the log's split (a warning), never the run. Issue 37, rule 4: a binary log was a
    UnicodeDecodeError traceback after a finished run, with no result."""
    bad = tmp_path / "not-a-log.jsonl"
    bad.write_bytes(content)
    res = tmp_path / "r.json"
    out = cli_in_process(
        ["run", "--endpoint", plain_serve.url, "--workload", "random", "--input-len", "16",
         "--output-len", "4", "--num-requests", "4", "--request-rate", "20",
         "--server-log", str(bad), "--output", str(res)],
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "warning: --server-log not used" in out.stderr
    result = json.loads(res.read_text())
    assert result["summary"]["completed"] == 4
    # The split still comes from the responses' own metrics, without the log's way-in part.
    assert all(r["ttft_parts"]["source"] == "response" for r in result["requests"])


def test_the_way_in_ends_where_the_queue_starts():
    # The queue starts at `admitted` (vLLM's QUEUED event, the response's queue_time_ms); the
    # way in runs to it, so the wait for the step in flight (5 -> 8 ms) is on the way in and
    # the parts still add up.
    ttft, _ = request_parts(_record(), {**LINE, "admitted": T0 + 1.008}, T0)
    assert ttft["network_in_ms"] == pytest.approx(6.0)
    assert ttft["server_queue_ms"] == pytest.approx(17.0)
    assert ttft["consistent"] and ttft["residual_ms"] == pytest.approx(0.0, abs=1e-9)
    rec = _record(server_timing={"queue_time_ms": 17.0, "time_to_first_token_ms": 70.0,
                                 "generation_time_ms": 20.0})
    ttft, _ = request_parts(rec, {**LINE, "admitted": T0 + 1.008}, T0)
    assert ttft["consistent"] and ttft["residual_ms"] == pytest.approx(0.0, abs=1e-9)
