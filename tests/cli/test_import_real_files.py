"""`cbbench import` of files the tools themselves wrote (tests/data/real/, trimmed copies of real
runs against tests/timing_server.py; the tools' output is Apache-2.0; tests/data/real/README.md
says how each was made): the current formats read, and every figure the tool's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

runner = CliRunner()
REAL = Path(__file__).resolve().parents[1] / "data" / "real"
GUIDELLM = REAL / "guidellm-0.8.1_benchmarks.json"
AIPERF = REAL / "aiperf-0.13.0_profile_export.jsonl"


def _import(src, tool, out):
    res = runner.invoke(app, ["import", str(src), "--from", tool, "--out", str(out)])
    return res, (json.loads(Path(out).read_text()) if res.exit_code == 0 else None)


def test_guidellm_0_8_scenario_is_read(tmp_path):
    # GuideLLM 0.8 writes its scenario under config.spec (backend.target/model, data a list of
    # objects): the import said model None, endpoint None, workload "unknown".
    res, result = _import(GUIDELLM, "guidellm", tmp_path / "g.json")
    assert res.exit_code == 0, res.output
    config = result["config"]
    assert (config["served_model"], config["endpoint"]) == ("timing-model",
                                                            "http://127.0.0.1:18431")
    assert "synthetic_text" in config["workload"] and "prompt_tokens" in config["workload"]
    assert (config["strategy"], config["request_rate"]) == ("constant", 10.0)
    assert result["summary"]["completed"] == 3


def test_a_sampled_guidellm_benchmark_is_refused(tmp_path):
    # --metrics kind=generative,sample_size=10 keeps 10 requests of the 59 GuideLLM ran (its
    # metrics.request_totals): imported, 10 completed and 1.67 req/s where GuideLLM said 9.88.
    data = json.loads(GUIDELLM.read_text())
    bench = data["benchmarks"][0]
    bench["config"]["sample_size"] = 3
    bench["metrics"]["request_totals"] = {"successful": 59, "errored": 0, "incomplete": 0,
                                          "total": 59}
    src = tmp_path / "sampled.json"
    src.write_text(json.dumps(data))
    res, _ = _import(src, "guidellm", tmp_path / "g.json")
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith("cbbench: error:") and "\n" not in line, line
    assert "3 of its 59 successful requests" in line and "sample_size" in line, line


def test_aiperf_0_13_records_are_aiperfs_figures(tmp_path):
    # A warm-up record, three profiling records, one 404: AIPerf's own per-request figures
    # (from the send) are cbbench's less the send lag (cbbench counts from the credit's release).
    rows = [json.loads(line) for line in AIPERF.read_text().splitlines()]
    profiling = [r for r in rows if r["metadata"]["benchmark_phase"] == "profiling"]
    res, result = _import(AIPERF, "aiperf", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    s, reqs = result["summary"], result["requests"]
    assert (s["completed"], s["failed"], s["error_types"]) == (3, 1, {"Not Found": 1})
    for rec, row in zip(reqs, profiling[:3]):
        m = row["metrics"]
        assert rec["ttft_ms"] - rec["send_lag_ms"] == pytest.approx(
            m["time_to_first_token"]["value"], abs=1e-6)
        assert rec["e2el_ms"] - rec["send_lag_ms"] == pytest.approx(
            m["request_latency"]["value"], abs=1e-6)
        assert rec["tpot_ms"] == pytest.approx(m["inter_token_latency"]["value"], abs=1e-9)
        assert (rec["prompt_tokens"], rec["output_tokens"]) == (63, 20)


def test_a_failed_aiperf_request_keeps_its_input_length(tmp_path):
    # AIPerf records an errored request's input length as error_isl (no input_sequence_length):
    # the 404's prompt_tokens were 0 where AIPerf says 63.
    res, result = _import(AIPERF, "aiperf", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    failed = [r for r in result["requests"] if r["error"]]
    assert [r["prompt_tokens"] for r in failed] == [63]


def test_an_aiperf_cancellation_is_cancelled_not_failed(tmp_path):
    # --request-cancellation-rate 50 --request-cancellation-delay 0.1: AIPerf marks the request
    # metadata.was_cancelled (its error a 499 RequestCancellationError): it was imported as
    # failed, where a cbbench --cancel-rate run counts the requests it gave up on as cancelled.
    src = REAL / "aiperf-0.13.0_profile_export_cancelled.jsonl"
    res, result = _import(src, "aiperf", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    s = result["summary"]
    assert (s["completed"], s["failed"], s["cancelled"]) == (1, 0, 1)
    assert [r["prompt_tokens"] for r in result["requests"]] == [63, 63]


def test_aiperfs_raw_export_is_named_and_refused(tmp_path):
    # profile_export_raw.jsonl (--export-level raw) holds the requests and responses, not the
    # metrics: refused with "a completed record without time_to_first_token".
    src = REAL / "aiperf-0.13.0_profile_export_raw.jsonl"
    res, _ = _import(src, "aiperf", tmp_path / "a.json")
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith("cbbench: error:") and "\n" not in line, line
    assert "raw export" in line and "profile_export.jsonl" in line.split("raw.jsonl")[-1], line


def test_an_unstreamed_aiperf_run_imports(tmp_path):
    # Without --streaming AIPerf records no time_to_first_token, only request_latency: the
    # file was refused ("a completed record without time_to_first_token"). The whole answer
    # arrives at the end, in one event, as inference-perf's import has it.
    src = REAL / "aiperf-0.13.0_profile_export_unstreamed.jsonl"
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    res, result = _import(src, "aiperf", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    assert result["summary"]["completed"] == 2
    for rec, row in zip(result["requests"], rows):
        assert rec["e2el_ms"] - rec["send_lag_ms"] == pytest.approx(
            row["metrics"]["request_latency"]["value"], abs=1e-6)
        assert rec["ttft_ms"] == rec["e2el_ms"] and rec["event_tokens"] == [20]


def test_an_unstreamed_guidellm_run_imports(tmp_path):
    # GuideLLM with stream=false keeps no token times, only request_end: its 2 successful
    # requests were imported as 2 failures ("no token arrived"), 0 completed.
    src = REAL / "guidellm-0.8.1_benchmarks_unstreamed.json"
    rows = json.loads(src.read_text())["benchmarks"][0]["requests"]["successful"]
    res, result = _import(src, "guidellm", tmp_path / "g.json")
    assert res.exit_code == 0, res.output
    assert (result["summary"]["completed"], result["summary"]["failed"]) == (2, 0)
    for rec, row in zip(result["requests"], rows):
        t = row["info"]["timings"]  # constant: from the targeted start
        assert rec["e2el_ms"] == pytest.approx((t["request_end"] - t["targeted_start"]) * 1e3,
                                               abs=1e-3)
        assert rec["ttft_ms"] == rec["e2el_ms"] and rec["event_tokens"] == [20]
