"""`cbbench import --from vllm-bench`: a vLLM bench --save-detailed result becomes a cbbench
result whose figures are hand-computed here, and that compare and export read."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

runner = CliRunner()

# vLLM bench's --save-detailed lists, in send order (vllm/benchmarks/serve.py): r0 streams 4
# tokens one per chunk, r1 3 tokens in 2 chunks (its second chunk holds 2), r2 times out.
VLLM_RESULT = {
    "date": "20261201-120000",
    "backend": "openai-chat",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "num_prompts": 3,
    "request_rate": 20.0,
    "burstiness": 1.0,
    "max_concurrency": None,
    "duration": 2.0,
    "completed": 2,
    "input_lens": [10, 20, 30],
    "output_lens": [4, 3, 0],
    "ttfts": [0.2, 0.1, 0.0],
    "itls": [[0.05, 0.05, 0.1], [0.3], []],
    "latencies": [0.4, 0.4, 0.0],
    "start_times": [100.0, 100.5, 101.0],
    "errors": ["", "", "TimeoutError"],
}


def _import(tmp_path, data) -> tuple[object, object]:
    src = tmp_path / "vllm.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "imported.json"
    res = runner.invoke(app, ["import", str(src), "--from", "vllm-bench", "--out", str(out)])
    return res, out


def test_vllm_bench_figures_are_the_hand_computed_ones(tmp_path):
    res, out = _import(tmp_path, VLLM_RESULT)
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["ttft_ms"]["mean"] == pytest.approx(150.0)  # 200 and 100 ms from each send
    assert s["e2el_ms"]["p50"] == pytest.approx(400.0)  # both end 0.4 s after their send
    # TPOT: (0.4 - 0.2) / 3 and (0.9 - 0.6) / 2 s.
    assert s["tpot_ms"]["mean"] == pytest.approx((200 / 3 + 150) / 2)
    # ITL per token: r0's chunks hold one token each (4 chunks, 4 tokens): 50, 50, 100 ms; r1's
    # 3 tokens in 2 chunks are spread (1, then 2), its 300 ms gap two of 150 ms. vLLM's own
    # per-chunk ITL (50, 50, 100, 300 ms) is the event gap.
    assert s["itl_ms"]["mean"] == pytest.approx(100.0)
    assert s["itl_ms"]["p50"] == pytest.approx(100.0)
    assert s["event_gap_ms"]["mean"] == pytest.approx(125.0)
    assert s["event_gap_ms"]["p50"] == pytest.approx(75.0)
    assert s["tokens_per_event"]["mean"] == pytest.approx(7 / 6)  # 7 tokens in 6 chunks
    assert s["output_throughput"] == pytest.approx(7 / 2.0)
    assert s["total_input_tokens"] == 30  # completed requests only, as a run counts them
    reqs = result["requests"]
    assert [r["intended_start_s"] for r in reqs] == pytest.approx([0.0, 0.5, 1.0])
    assert [r.get("tokens_per_event_method") for r in reqs] == ["chunk_count", "spread", None]
    assert reqs[1]["event_tokens"] == [1, 2]
    assert reqs[2]["error"] == "TimeoutError"
    assert result["config"]["imported_from"] == "vllm-bench"
    assert "http" not in s  # no --same-host: its times are on no known clock


@pytest.fixture
def new_york(monkeypatch):
    """The process's local time zone is UTC-5 (December) for one test."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_started_at_is_the_local_end_date_less_the_duration(tmp_path, new_york):
    # vLLM stamps `date` with datetime.now() -- local time -- when the run has ended.
    res, out = _import(tmp_path, VLLM_RESULT)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["started_at"] == "2026-12-01T16:59:58+00:00"


def test_queue_times_are_the_send_lag_and_server_timings_split_the_ttft(tmp_path):
    # vLLM 0.33 also keeps queue_times (schedule release -> send) and, from a server with
    # --enable-per-request-metrics, server_queue_times / server_ttfts (s).
    data = {**VLLM_RESULT, "queue_times": [0.01, 0.0, 0.02],
            "server_queue_times": [0.03, 0.02, None], "server_ttfts": [0.1, 0.05, None]}
    res, out = _import(tmp_path, data)
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    reqs = result["requests"]
    # The zero is r0's release (100.0 - 0.01): r0 sent 10 ms after it, r1 at its release.
    assert [r["intended_start_s"] for r in reqs] == pytest.approx([0.0, 0.51, 0.99])
    assert [r["send_lag_ms"] for r in reqs] == pytest.approx([10.0, 0.0, 20.0])
    assert reqs[0]["ttft_ms"] == pytest.approx(210.0)  # from the release: vLLM's 200 + 10
    p0 = reqs[0]["ttft_parts"]
    assert (p0["server_queue_ms"], p0["server_prefill_ms"]) == pytest.approx((30.0, 100.0))
    assert p0["network_ms"] == pytest.approx(210.0 - 10.0 - 30.0 - 100.0)  # the rest
    assert reqs[2].get("ttft_parts") is None  # failed: no split
    b = result["summary"]["ttft_breakdown"]
    assert b["requests"] == 2 and b["flagged"] == 0 and b["sources"] == ["response"]
    assert b["server_queue_ms"]["mean"] == pytest.approx(25.0)


# vllm bench serve --max-concurrency 1 --request-rate inf: all three released at 100.0 s, each
# waiting for the semaphore (queue_times 0, 0.5, 1.0 s), then TTFT 0.1 s and E2EL 0.4 s from its
# send (vLLM's own mean_ttft_ms 100, mean_e2el_ms 400).
CAPPED = {
    "date": "20260101-120000", "duration": 1.6, "model_id": "m", "request_rate": "inf",
    "max_concurrency": 1, "backend": "openai", "dataset_name": "random",
    "input_lens": [10, 10, 10], "output_lens": [4, 4, 4], "ttfts": [0.1, 0.1, 0.1],
    "itls": [[0.1, 0.1, 0.1]] * 3, "latencies": [0.4, 0.4, 0.4],
    "start_times": [100.0, 100.5, 101.0], "queue_times": [0.0, 0.5, 1.0], "errors": ["", "", ""],
    "mean_ttft_ms": 100.0, "mean_e2el_ms": 400.0,
}


def test_max_concurrency_queue_times_are_a_slot_wait(tmp_path):
    res, out = _import(tmp_path, CAPPED)
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    s = result["summary"]
    # As a cbbench --max-concurrency run: from the release (t=0) the slot wait counts, ...
    assert s["latency_basis"] == "intended_start"
    assert s["ttft_ms"]["mean"] == pytest.approx(600.0)  # 100, 600, 1100
    assert s["e2el_ms"]["mean"] == pytest.approx(900.0)  # 400, 900, 1400
    assert s["slot_wait_ms"]["mean"] == pytest.approx(500.0)  # 0, 500, 1000: queue_times
    assert s["send_lag_ms"]["p99"] == pytest.approx(0.0)  # sent the moment it held a slot
    # ... and from the send TTFT and E2EL are vLLM's own (was: no from_send, no basis).
    assert s["from_send"]["ttft_ms"]["mean"] == pytest.approx(CAPPED["mean_ttft_ms"])
    assert s["from_send"]["e2el_ms"]["mean"] == pytest.approx(CAPPED["mean_e2el_ms"])
    reqs = result["requests"]
    assert [r["slot_wait_ms"] for r in reqs] == pytest.approx([0.0, 500.0, 1000.0])
    assert [r["ttft_from_send_ms"] for r in reqs] == pytest.approx([100.0, 100.0, 100.0])
    # Exported to llm-d's report, a closed loop counts from the send: vLLM's figures again.
    br = tmp_path / "br.json"
    res = runner.invoke(app, ["export", str(out), "--format", "br0.2", "--out", str(br)])
    assert res.exit_code == 0, res.output
    lat = json.loads(br.read_text())["results"]["request_performance"]["aggregate"]["latency"]
    assert lat["time_to_first_token"]["mean"] == pytest.approx(100.0)
    assert lat["request_latency"]["mean"] == pytest.approx(400.0)


def test_without_max_concurrency_queue_times_stay_send_lag(tmp_path):
    res, out = _import(tmp_path, {**CAPPED, "max_concurrency": None, "request_rate": 2.0})
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())["summary"]
    assert "from_send" not in s and "latency_basis" not in s
    assert s["send_lag_ms"]["mean"] == pytest.approx(500.0)  # an open loop that fell behind


# This host's perf_counter, real or faked: a fresh CI machine reads a few minutes since boot,
# so a file "from an hour before" has negative perf_counter times there (any uptime must pass).
BOOTED_5_MIN_AGO_S = 300.0
UP_30_DAYS_S = 30 * 86400.0


@pytest.fixture(params=["real", BOOTED_5_MIN_AGO_S, UP_30_DAYS_S],
                ids=["real-clock", "booted-5-min-ago", "up-30-days"])
def perf_now(request, monkeypatch):
    """This host's perf_counter now (a function), with the importer reading the same clock: the
    real one, or a fake one that reads the given uptime now (the epoch's offset made to match)."""
    if request.param == "real":
        return time.perf_counter
    from cbbench.importers import vllm_bench

    minus_epoch = request.param - time.time()  # perf_counter - time.time() on the fake host
    monkeypatch.setattr(vllm_bench, "perf_minus_epoch", lambda: minus_epoch)
    return lambda: time.time() + minus_epoch


def _written_here_now(perf_now, offset_s: float = 0.0) -> dict:
    """A result as vLLM bench writes it on this host: perf_counter sends, a local end date."""
    now = perf_now() + offset_s
    data = {**VLLM_RESULT, "start_times": [now - 2.0, now - 1.5, now - 1.0], "duration": 2.0}
    data["date"] = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return data


def test_same_host_puts_the_perf_counter_times_on_the_unix_clock(tmp_path, perf_now):
    data = _written_here_now(perf_now)
    src = tmp_path / "vllm.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "imported.json"
    expected = time.time() - (perf_now() - data["start_times"][0])
    res = runner.invoke(app, ["import", str(src), "--from", "vllm-bench", "--out", str(out),
                              "--same-host"])
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert result["summary"]["http"]["t0_epoch_s"] == pytest.approx(expected, abs=0.005)


@pytest.mark.parametrize("offset_s", [-3600.0, 3600.0])  # another host, or before a reboot
def test_same_host_refuses_a_file_from_elsewhere(tmp_path, offset_s, perf_now):
    """Refused for its date, at any uptime: booted 5 minutes ago, a file an hour older has
    negative perf_counter times, which are clock readings (Python leaves perf_counter's zero
    undefined), not malformed durations."""
    src = tmp_path / "vllm.json"
    src.write_text(json.dumps(_written_here_now(perf_now, offset_s)))
    out = tmp_path / "imported.json"
    res = runner.invoke(app, ["import", str(src), "--from", "vllm-bench", "--out", str(out),
                              "--same-host"])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith("cbbench: error:") and "\n" not in line
    assert "not written on this host since its last boot" in line
    assert not out.exists()


def test_negative_perf_counter_send_times_import(tmp_path):
    """vLLM's start_times are perf_counter readings, whose zero Python leaves undefined: a file
    whose sends read below zero imports like any other (only durations must be >= 0)."""
    data = {**VLLM_RESULT, "start_times": [s - 1000.0 for s in VLLM_RESULT["start_times"]]}
    assert max(data["start_times"]) < 0
    res, out = _import(tmp_path, data)
    assert res.exit_code == 0, res.output
    shifted = json.loads(out.read_text())
    res, out = _import(tmp_path, VLLM_RESULT)
    assert res.exit_code == 0, res.output
    plain = json.loads(out.read_text())
    assert [r["intended_start_s"] for r in shifted["requests"]] == pytest.approx([0.0, 0.5, 1.0])
    assert shifted["requests"] == plain["requests"]  # only the clock's zero moved
    bad = {**VLLM_RESULT, "ttfts": [-0.2, 0.1, 0.0]}  # a duration below zero stays refused
    res, out = _import(tmp_path, bad)
    assert res.exit_code == 2 and "ttfts holds -0.2, not a time in seconds" in res.output


def test_same_host_is_for_vllm_bench_only(tmp_path):
    src = tmp_path / "x.jsonl"
    src.write_text("")
    res = runner.invoke(app, ["import", str(src), "--from", "aiperf", "--out",
                              str(tmp_path / "o.json"), "--same-host"])
    assert res.exit_code == 2 and "--same-host is for vllm-bench" in res.output


def test_an_imported_result_is_read_by_compare_and_export(tmp_path):
    res, out = _import(tmp_path, VLLM_RESULT)
    assert res.exit_code == 0, res.output
    cmp = runner.invoke(app, ["compare", str(out), str(out)])
    assert cmp.exit_code == 0, cmp.output
    assert "TTFT" in cmp.output or "ttft" in cmp.output
    br = runner.invoke(app, ["export", str(out), "--out", str(tmp_path / "br.json")])
    assert br.exit_code == 0, br.output


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("itls"), "run vllm bench serve with --save-result --save-detailed"),
        (lambda d: d["ttfts"].__setitem__(0, -1.0), "not a time in seconds"),
        (lambda d: d["output_lens"].__setitem__(0, "four"), "not a token count"),
        (lambda d: d["errors"].pop(), "different lengths"),
        (lambda d: d.__setitem__("queue_times", [0.1]), "queue_times is not a list of one"),
        (lambda d: d.__setitem__("server_ttfts", [0.1, "x", None]), "not a time in seconds"),
    ],
)
def test_a_bad_vllm_file_is_one_line_and_exit_2(tmp_path, mutate, message):
    data = json.loads(json.dumps(VLLM_RESULT))
    mutate(data)
    res, out = _import(tmp_path, data)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith("cbbench: error:") and "\n" not in line and message in line
    assert not out.exists()  # nothing half-written


def test_an_unknown_tool_is_refused(tmp_path):
    src = tmp_path / "x.json"
    src.write_text("{}")
    res = runner.invoke(app, ["import", str(src), "--from", "locust", "--out", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and "--from 'locust': use one of vllm-bench" in res.output


def _aiperf_line(start_ns, issued_ns, ttft_ms, chunks_ms, osl, isl, error=None, phase="profiling"):
    metrics = {
        "time_to_first_token": {"value": ttft_ms, "unit": "ms"},
        "request_latency": {"value": ttft_ms + sum(chunks_ms), "unit": "ms"},
        "inter_chunk_latency": {"value": chunks_ms, "unit": "ms"},
        "output_sequence_length": {"value": osl, "unit": "tokens"},
        "input_sequence_length": {"value": isl, "unit": "tokens"},
    }
    return json.dumps({
        "metadata": {"session_num": 0, "x_request_id": f"req-{start_ns}",
                     "credit_issued_ns": issued_ns, "request_start_ns": start_ns,
                     "request_end_ns": start_ns + 1, "worker_id": "w", "record_processor_id": "p",
                     "benchmark_phase": phase},
        "metrics": {} if error else metrics,
        "error": {"code": 500, "type": "HTTPError", "message": error} if error else None,
    })


def _import_aiperf(tmp_path, lines: list[str]) -> dict:
    """`cbbench import --from aiperf` of these profile_export.jsonl lines: the result read back."""
    src = tmp_path / "profile_export.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "imported.json"
    res = runner.invoke(app, ["import", str(src), "--from", "aiperf", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_aiperf_records_figures_are_the_hand_computed_ones(tmp_path):
    base = 10**18
    lines = [
        # warm-up: left out
        _aiperf_line(base - 10**9, base - 10**9, 999.0, [1.0], 2, 5, phase="warmup"),
        # released at t0, sent 2 ms later: TTFT 100 ms from the send, 102 from the slot
        _aiperf_line(base + 2_000_000, base, 100.0, [20.0, 20.0], 3, 10),
        # released 0.5 s later, sent on time, 2 tokens
        _aiperf_line(base + 500_000_000, base + 500_000_000, 50.0, [10.0], 2, 20),
        _aiperf_line(base + 600_000_000, base + 600_000_000, 0.0, [], 0, 30, error="boom"),
    ]
    result = _import_aiperf(tmp_path, lines)
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["ttft_ms"]["mean"] == pytest.approx((102.0 + 50.0) / 2)
    assert s["send_lag_ms"]["p50"] == pytest.approx(0.0) and s["send_lag_ms"]["mean"] == pytest.approx(2 / 3)
    assert s["tpot_ms"]["mean"] == pytest.approx((40.0 / 2 + 10.0 / 1) / 2)
    assert s["itl_ms"]["mean"] == pytest.approx((20 + 20 + 10) / 3)
    assert s["e2el_ms"]["p50"] == pytest.approx((142.0 + 60.0) / 2)
    assert result["requests"][0]["server_request_id"] == f"req-{base + 2_000_000}"
    assert result["requests"][2]["error"] == "boom"


def test_aiperf_itl_is_per_token_where_chunks_held_several(tmp_path):
    """AIPerf times chunks, not tokens. Record A: OSL 10 in 4 chunks (TTFT 100 ms, then 30 ms
    gaps; AIPerf's own inter_token_latency (190 - 100) / 9 = 10 ms); record B: OSL 2 in 2
    chunks 40 ms apart."""
    base = 1_700_000_000 * 10**9
    lines = [_aiperf_line(base + 10_000_000, base, 100.0, [30.0, 30.0, 30.0], 10, 5),
             _aiperf_line(base + 50_000_000, base + 50_000_000, 200.0, [40.0], 2, 7)]
    result = _import_aiperf(tmp_path, lines)
    s, reqs = result["summary"], result["requests"]
    # A's 10 tokens spread over its 4 chunks: 1, 3, 3, 3 -- nine 10 ms gaps, AIPerf's own ITL;
    # B one token a chunk: one 40 ms gap. Per token: (9 * 10 + 40) / 10 = 13 ms over 10 gaps
    # (was 32.5 ms over 4: the chunk gaps under the per-token name).
    assert reqs[0]["event_tokens"] == [1, 3, 3, 3]
    assert reqs[0]["tokens_per_event_method"] == "spread"
    assert reqs[1]["event_tokens"] == [1, 1]
    assert reqs[1]["tokens_per_event_method"] == "chunk_count"
    assert reqs[0]["itl_ms"] == pytest.approx([10.0] * 9)
    assert (s["itl_ms"]["mean"], s["itl_ms"]["count"]) == pytest.approx((13.0, 10))
    assert s["itl_ms"]["p50"] == pytest.approx(10.0)
    # 12 tokens in 6 chunks: 2.0 a chunk (was 1.0, one token a chunk assumed).
    assert (s["tokens_per_event"]["mean"], s["tokens_per_event"]["count"]) == pytest.approx(
        (2.0, 6))
    # AIPerf's inter_chunk_latency is the event gap, as it wrote it: 30, 30, 30, 40 ms.
    assert (s["event_gap_ms"]["mean"], s["event_gap_ms"]["count"]) == pytest.approx((32.5, 4))
    assert s["tpot_ms"]["mean"] == pytest.approx((10.0 + 40.0) / 2)  # unchanged


def test_a_bad_aiperf_file_is_one_line_and_exit_2(tmp_path):
    src = tmp_path / "profile_export.jsonl"
    src.write_text('{"metadata": {"request_start_ns": -5}, "metrics": {}}\n')
    res = runner.invoke(app, ["import", str(src), "--from", "aiperf", "--out", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and "not a time in ns" in res.output, res.output
    res = runner.invoke(app, ["import", str(tmp_path / "missing.jsonl"), "--from", "aiperf",
                              "--out", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and res.output.startswith("cbbench: error: cannot read"), res.output


@pytest.mark.parametrize(("date", "message"), [
    (None, "has no date to check --same-host against"),
    ("2026-12-01 12:00", "is not vLLM's %Y%m%d-%H%M%S"),
])
def test_same_host_needs_vllms_date(tmp_path, date, message):
    data = _written_here_now(time.perf_counter)
    if date is None:
        del data["date"]
    else:
        data["date"] = date
    src = tmp_path / "vllm.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "imported.json"
    res = runner.invoke(app, ["import", str(src), "--from", "vllm-bench", "--out", str(out),
                              "--same-host"])
    assert res.exit_code == 2 and message in res.output and not out.exists()


# vLLM's `errors` entries as a real run against a killed `cbbench serve` and one refusing long
# prompts wrote them (shortened): a reason phrase, or the client's whole traceback.
TRACEBACK = ("Traceback (most recent call last):\n  File \"connector.py\", line 1322, in _wrap\n"
             "ConnectionRefusedError: [Errno 111] Connect call failed\n\nThe above exception "
             "was the direct cause of the following exception:\n\nTraceback (most recent call "
             "last):\n  File \"endpoint_request_func.py\", line 447, in chat\n"
             "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host "
             "127.0.0.1:18800 ssl:default [Connect call failed ('127.0.0.1', 18800)]\n")
CUT = ("Traceback (most recent call last):\n  File \"x.py\", line 1\naiohttp.client_exceptions."
       "ClientPayloadError: Response payload is not completed\n")


def test_vllm_errors_are_typed_and_a_traceback_kept_as_its_last_line(tmp_path):
    data = {**VLLM_RESULT, "errors": ["Bad Request", TRACEBACK, CUT],
            "output_lens": [0, 0, 0], "ttfts": [0.0, 0.0, 0.0], "itls": [[], [], []]}
    res, out = _import(tmp_path, data)
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    reqs = result["requests"]
    assert [r["error_type"] for r in reqs] == ["http_status", "connect", "stream_cut"]
    assert reqs[0]["error"] == "HTTP Bad Request"
    assert reqs[1]["error"].startswith("aiohttp.client_exceptions.ClientConnectorError: Cannot")
    assert "\n" not in reqs[1]["error"]
    assert result["summary"]["error_types"] == {"http_status": 1, "connect": 1, "stream_cut": 1}


def test_a_failure_vllm_gave_no_reason_is_not_a_completed_request(tmp_path):
    # A non-200 answer without a reason phrase: vLLM's error is "", its TTFT 0, no output.
    data = {**VLLM_RESULT, "errors": ["", "", "TimeoutError"],
            "output_lens": [4, 0, 0], "ttfts": [0.2, 0.0, 0.0], "itls": [[0.05] * 3, [], []]}
    res, out = _import(tmp_path, data)
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert (result["summary"]["completed"], result["summary"]["failed"]) == (1, 2)
    r1 = result["requests"][1]
    assert r1["error"] == "failed (vLLM bench recorded no reason)" and r1["error_type"] == "error"
    assert result["requests"][2]["error_type"] == "timeout"


def test_aiperf_import_keeps_when_the_run_started(tmp_path):
    """AIPerf stamps every record on the Unix clock (time.time_ns()), yet the imported result's
    started_at was null, and its BR0.2 export had no run.time.start or end: when the run
    happened was lost. It is the records' zero (the first credit's release), as GuideLLM's
    import takes its benchmark's start_time."""
    base = 1_765_000_000 * 10**9  # 2025-12-06T05:46:40Z
    result = _import_aiperf(tmp_path, [_aiperf_line(base + 2_000_000, base, 10.0, [1.0], 2, 5)])
    assert result["started_at"] == "2025-12-06T05:46:40+00:00"
    assert result["summary"]["http"]["t0_epoch_s"] == base / 1e9
