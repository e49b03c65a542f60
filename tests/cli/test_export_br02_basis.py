"""BR0.2's latency basis: under a --max-concurrency cap TTFT, E2EL and NTPOT count from the send
(as every source llm-d converts counts them: vLLM's mean_ttft_ms starts after its concurrency
semaphore), in an open loop from the intended start (the result's own figures). The figures are
computed by hand from the request times below."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from helpers import serve_process
from typer.testing import CliRunner

from cbbench.analysis.records import RequestRecord
from cbbench.cli.app import app
from cbbench.importers.result import build_result

SCHEMA = Path(__file__).resolve().parent.parent / "data" / "llm-d" / "br_v0_2_json_schema.json"
runner = CliRunner()


def _records(capped: bool) -> list[RequestRecord]:
    """Three requests of 4 tokens, all meant for t=0 (--request-rate inf). Request i got a slot
    at 0.5 i s and was sent 10 i ms later; its tokens came 100, 200, 300 and 400 ms after the
    send. Open loop (not capped): the same sends against intended starts 0.5 i s."""
    recs = []
    for i in range(3):
        send = 0.5 * i + 0.01 * i
        rec = RequestRecord(id=i, prompt_tokens=10, output_tokens=4,
                            intended_start_s=0.0 if capped else 0.5 * i, send_s=send,
                            token_times_s=[send + 0.1, send + 0.2, send + 0.3, send + 0.4])
        if capped:
            rec.slot_s = 0.5 * i
        recs.append(rec)
    return recs


def _result(tmp_path: Path, capped: bool, detailed: bool = True, summary_only: bool = False):
    recs = _records(capped)
    config = {"target": "http", "workload": "random", "num_requests": 3, "request_rate": "inf",
              "max_concurrency": 1 if capped else None}
    result = build_result(config, "2026-12-07T00:00:00+00:00", recs, 1.42)
    if not detailed:  # a run without --save-detailed: no send_s, no token times
        for r in result["requests"]:
            for k in ("token_times_s", "send_s", "first_output_s", "event_tokens", "itl_ms"):
                r.pop(k, None)
    if summary_only:
        del result["requests"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    return path, result


def _latency(tmp_path: Path, path: Path) -> dict:
    out = tmp_path / "br.json"
    res = runner.invoke(app, ["export", str(path), "--format", "br0.2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(
        report)
    return report["results"]["request_performance"]["aggregate"]["latency"]


@pytest.mark.parametrize("detailed", [True, False], ids=["detailed", "not-detailed"])
def test_a_closed_loop_counts_br02_latencies_from_the_send(tmp_path, detailed):
    path, result = _result(tmp_path, capped=True, detailed=detailed)
    s = result["summary"]
    # The result's own basis: from t=0, the slot wait and send lag included (100, 610, 1120 ms).
    assert s["latency_basis"] == "intended_start"
    assert s["ttft_ms"]["mean"] == pytest.approx(610.0)
    lat = _latency(tmp_path, path)
    ttft, e2el = lat["time_to_first_token"], lat["request_latency"]
    # From the send: 100 ms to the first token and 400 ms to the last, for every request (was:
    # 610 and 910, the wait for the slot counted as the server's latency).
    assert (ttft["mean"], ttft["min"], ttft["max"]) == pytest.approx((100.0, 100.0, 100.0))
    assert (e2el["mean"], e2el["p50"], e2el["max"]) == pytest.approx((400.0, 400.0, 400.0))
    # NTPOT: E2EL from the send over 4 tokens (was 910 / 4 on average).
    assert lat["normalized_time_per_output_token"]["mean"] == pytest.approx(100.0)
    assert lat["time_per_output_token"]["mean"] == pytest.approx(100.0)  # (400 - 100) / 3
    assert ttft["p50"] == pytest.approx(s["from_send"]["ttft_ms"]["p50"])


def test_a_summary_only_closed_loop_takes_the_from_send_distributions(tmp_path):
    path, _ = _result(tmp_path, capped=True, summary_only=True)
    lat = _latency(tmp_path, path)
    assert lat["time_to_first_token"]["mean"] == pytest.approx(100.0)
    assert lat["request_latency"]["mean"] == pytest.approx(400.0)


def test_an_open_loop_counts_from_the_intended_start(tmp_path):
    # Intended 0, 0.5, 1.0 s; sent 0, 10 and 20 ms late: TTFT 100, 110, 120 ms, E2EL 400, 410,
    # 420 ms -- the send lag counted, as the result's own figures (vLLM counts from its send).
    path, result = _result(tmp_path, capped=False)
    assert "from_send" not in result["summary"]
    lat = _latency(tmp_path, path)
    assert lat["time_to_first_token"]["mean"] == pytest.approx(110.0)
    assert lat["request_latency"]["mean"] == pytest.approx(410.0)
    assert lat["normalized_time_per_output_token"]["mean"] == pytest.approx(410.0 / 4)


def test_a_real_closed_loop_run_exports_its_from_send_figures(tmp_path):
    out = tmp_path / "http.json"
    with serve_process("--engine", "sim", "--model", "llama-3.2-1b", "--gpu", "h200") as server:
        res = runner.invoke(app, ["run", "--endpoint", server.url, "--workload", "random",
                                  "--input-len", "64", "--output-len", "16",
                                  "--num-requests", "8", "--max-concurrency", "2",
                                  "--output", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())["summary"]
    lat = _latency(tmp_path, out)
    for br, ours in (("time_to_first_token", "ttft_ms"), ("request_latency", "e2el_ms")):
        for stat in ("mean", "p50", "p99"):
            assert lat[br][stat] == pytest.approx(s["from_send"][ours][stat], rel=1e-9), (br, stat)
