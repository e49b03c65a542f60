"""`cbbench import --from guidellm|inference-perf` (issue 27, Build 8): files in each tool's own
shape (tests/data/guidellm/benchmarks.json: GuideLLM's GenerativeBenchmarksReport v2, its
requests as GenerativeRequestStats dumps; tests/data/inference-perf/
per_request_lifecycle_metrics.json: inference-perf's per-request report; both hand-made from
the tools' models, see docs/export.md) give the hand-computed figures below, and compare,
gate, report and export read the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

runner = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "data"
GUIDELLM = DATA / "guidellm" / "benchmarks.json"
INFERENCE_PERF = DATA / "inference-perf" / "per_request_lifecycle_metrics.json"


def _import(src, tool, out, *extra):
    res = runner.invoke(app, ["import", str(src), "--from", tool, "--out", str(out), *extra])
    return res, (json.loads(Path(out).read_text()) if res.exit_code == 0 else None)


def _one_line(res, says: str) -> None:
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith("cbbench: error:") and "\n" not in line and says in line, line


# ---- GuideLLM ------------------------------------------------------------------------------
def test_guidellm_figures_are_the_hand_computed_ones(tmp_path):
    # A GuideLLM sweep-like file holds two benchmarks: one must be chosen.
    res, _ = _import(GUIDELLM, "guidellm", tmp_path / "x.json")
    _one_line(res, "holds 2 benchmarks (0: constant 2, 1: synchronous): choose one with "
                   "--benchmark INDEX")
    res, result = _import(GUIDELLM, "guidellm", tmp_path / "g.json", "--benchmark", "0")
    assert res.exit_code == 0, res.output
    s, reqs = result["summary"], result["requests"]
    # a: targeted 0, sent 10 ms late, first token 110 ms, last 410 ms, 7 tokens in 4 events;
    # b: targeted 0.5 s, sent 2 ms late, first (reasoning) token 202 ms, first answer 402 ms,
    #    last 602 ms, 5 tokens in 5 events; c errored; d was in flight at the end.
    assert (s["completed"], s["failed"]) == (2, 2)
    assert [r["ttft_ms"] for r in reqs[:2]] == pytest.approx([110.0, 202.0], abs=1e-3)
    assert [r["e2el_ms"] for r in reqs[:2]] == pytest.approx([410.0, 602.0], abs=1e-3)
    assert [r["tpot_ms"] for r in reqs[:2]] == pytest.approx([50.0, 100.0], abs=1e-3)
    assert [r["send_lag_ms"] for r in reqs[:2]] == pytest.approx([10.0, 2.0], abs=1e-3)
    assert reqs[1]["ttfot_ms"] == pytest.approx(402.0, abs=1e-3)
    assert reqs[0]["server_request_id"] == "cmpl-a"
    assert reqs[2]["error_type"] == "error" and "500" in reqs[2]["error"]
    assert reqs[3]["error_type"] == "interrupted"
    # ITL: a's 3 later events (100 ms apart) carry 6 tokens, 2 each -> six 50 ms gaps; b's four
    # 100 ms gaps -> 10 gaps, mean (6 * 50 + 4 * 100) / 10.
    assert s["itl_ms"]["mean"] == pytest.approx(70.0, abs=1e-3)
    assert s["itl_ms"]["p50"] == pytest.approx(50.0, abs=1e-3)
    assert s["output_throughput"] == pytest.approx(12 / 2.0)  # over GuideLLM's 2 s duration
    assert result["config"]["imported_from"] == "guidellm"
    assert result["config"]["strategy"] == "constant" and result["config"]["request_rate"] == 2.0
    res, other = _import(GUIDELLM, "guidellm", tmp_path / "g1.json", "--benchmark", "1")
    assert res.exit_code == 0 and other["summary"]["completed"] == 1
    assert other["requests"][0]["ttft_ms"] == pytest.approx(50.0, abs=1e-3)


@pytest.mark.parametrize("mutate,says", [
    (lambda d: d.pop("benchmarks"), "holds no benchmarks"),
    (lambda d: d["benchmarks"][0]["requests"]["successful"][0]["info"]["timings"].__setitem__(
        "first_token_iteration", "soon"), "not a time"),
    (lambda d: d["benchmarks"][0]["requests"]["successful"][0]["output_metrics"].__setitem__(
        "text_tokens", -3), "not a token count"),
])
def test_a_bad_guidellm_file_is_one_line(tmp_path, mutate, says):
    data = json.loads(GUIDELLM.read_text())
    mutate(data)
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(data))
    res, _ = _import(src, "guidellm", tmp_path / "o.json", "--benchmark", "0")
    _one_line(res, says)
    assert not (tmp_path / "o.json").exists()
    res, _ = _import(GUIDELLM, "guidellm", tmp_path / "o.json", "--benchmark", "5")
    _one_line(res, "--benchmark 5: ")
    res, _ = _import(INFERENCE_PERF, "inference-perf", tmp_path / "o.json", "--benchmark", "0")
    _one_line(res, "it needs --from guidellm")


def _throughput_at_1(strategy: dict) -> dict:
    """GuideLLM throughput --max-concurrency 1 as its scheduler records it: every request's
    targeted_start is the strategy's start T (ThroughputStrategy.next_request_time), and each
    waits for the one slot. Request a of the file (sent 10 ms after T, first token 100 ms after
    its send, last 400 ms, 7 tokens in 4 events) three times, the copies k = 0, 1, 2 each sent k
    s later; GuideLLM's own TTFT (first token - request_start) is 100 ms for each."""
    data = json.loads(GUIDELLM.read_text())
    bench = data["benchmarks"][0]
    a = bench["requests"]["successful"][0]
    copies = []
    for k in range(3):
        r = json.loads(json.dumps(a))
        t = r["info"]["timings"]
        for key, v in t.items():
            if key != "targeted_start" and isinstance(v, float):
                t[key] = v + k
        r["response_id"] = f"cmpl-{k}"
        copies.append(r)
    bench["requests"] = {"successful": copies, "incomplete": [], "errored": []}
    bench["config"]["strategy"] = strategy
    data["benchmarks"] = [bench]
    return data


@pytest.mark.parametrize("strategy", [
    {"type_": "throughput", "max_concurrency": 1},
    {"type_": "synchronous"},
    {"type_": "concurrent", "streams": 1},
], ids=["throughput", "synchronous", "concurrent"])
def test_a_strategy_without_a_schedule_counts_from_the_send(tmp_path, strategy):
    src = tmp_path / "g.json"
    src.write_text(json.dumps(_throughput_at_1(strategy)))
    res, result = _import(src, "guidellm", tmp_path / "o.json")
    assert res.exit_code == 0, res.output
    s, reqs = result["summary"], result["requests"]
    # From the send, as GuideLLM's time_to_first_token_ms (was: from T, 110 / 1110 / 2110 ms,
    # mean 1110: the wait for the slot taken as the server's).
    assert [r["ttft_ms"] for r in reqs] == pytest.approx([100.0] * 3, abs=1e-3)
    assert [r["e2el_ms"] for r in reqs] == pytest.approx([400.0] * 3, abs=1e-3)
    assert [r["intended_start_s"] for r in reqs] == pytest.approx([0.0, 1.0, 2.0], abs=1e-6)
    assert s["ttft_ms"]["mean"] == pytest.approx(100.0, abs=1e-3)
    assert s["latency_basis"] == "send"
    assert s["send_lag_ms"]["mean"] == pytest.approx(0.0)


@pytest.mark.parametrize("kind", ["constant", "poisson", "trace"])
def test_a_scheduled_strategy_counts_from_the_targeted_start(tmp_path, kind):
    # The same times under a strategy with an arrival schedule: all three were meant for T,
    # so the 10 ms, 1.01 s and 2.01 s until their sends count (no coordinated omission).
    src = tmp_path / "g.json"
    src.write_text(json.dumps(_throughput_at_1({"type_": kind, "rate": 10.0})))
    res, result = _import(src, "guidellm", tmp_path / "o.json")
    assert res.exit_code == 0, res.output
    s, reqs = result["summary"], result["requests"]
    assert [r["ttft_ms"] for r in reqs] == pytest.approx([110.0, 1110.0, 2110.0], abs=1e-3)
    assert [r["send_lag_ms"] for r in reqs] == pytest.approx([10.0, 1010.0, 2010.0], abs=1e-3)
    assert "latency_basis" not in s


# ---- inference-perf ------------------------------------------------------------------------
def test_inference_perf_figures_are_the_hand_computed_ones(tmp_path):
    res, result = _import(INFERENCE_PERF, "inference-perf", tmp_path / "i.json")
    assert res.exit_code == 0, res.output
    s, reqs = result["summary"], result["requests"]
    # e0: 6 tokens in 4 chunks (1, 2, 1, 2) at 100, 200, 300, 450 ms; e1 (adapter sql): 2
    # tokens at 200 and 300 ms after its send; e2: HTTP 500; e3: not streamed, 400 ms.
    assert (s["completed"], s["failed"]) == (3, 1)
    assert [r["ttft_ms"] for r in reqs] == pytest.approx([100.0, 200.0, None, 400.0], abs=1e-6)
    assert [r["e2el_ms"] for r in reqs] == pytest.approx([450.0, 300.0, None, 400.0], abs=1e-6)
    assert reqs[0]["tpot_ms"] == pytest.approx(70.0, abs=1e-6)  # 350 ms over 5 gaps
    assert reqs[0]["output_tokens"] == 6 and reqs[0]["server_prompt_tokens"] == 21
    assert reqs[0]["server_request_id"] == "cmpl-e0"
    assert [r["model"] for r in reqs] == ["m-base", "sql", "m-base", "m-base"]
    assert reqs[2]["error_type"] == "HTTP Error 500" and reqs[2]["error"] == "boom"
    # per-token ITL: e0's gaps 100/2, 100/2, 100/1, 150/2 ms; e1's 100 ms (one per chunk).
    assert s["itl_ms"]["mean"] == pytest.approx((50 + 50 + 100 + 75 + 75 + 100) / 6, abs=1e-6)
    assert s["duration_s"] == pytest.approx(1.0)  # last end - first start
    assert set(s["by_model"]) == {"m-base", "sql"}
    assert s["by_model"]["sql"]["completed"] == 1 and s["by_model"]["m-base"]["failed"] == 1


def test_a_bad_inference_perf_file_is_one_line(tmp_path):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps({"not": "a list"}))
    res, _ = _import(src, "inference-perf", tmp_path / "o.json")
    _one_line(res, "not an inference-perf per-request report")
    rows = json.loads(INFERENCE_PERF.read_text())
    rows[0]["info"]["response_metrics"]["chunk_times"][1] = None
    src.write_text(json.dumps(rows))
    res, _ = _import(src, "inference-perf", tmp_path / "o.json")
    _one_line(res, "chunk_times holds None")


def _shift_clock(rows: list, by_s: float) -> list:
    """The same report read off a perf_counter whose zero lies ``by_s`` seconds later."""
    for e in rows:
        e["start_time"] -= by_s
        e["end_time"] -= by_s
        m = e["info"].get("response_metrics") or {}
        for k in ("chunk_times", "output_token_times"):
            if m.get(k):
                m[k] = [t - by_s for t in m[k]]
    return rows


@pytest.mark.parametrize("uptime_s", [300.0, 30 * 86400.0])
def test_inference_perf_times_below_zero_import_alike(tmp_path, uptime_s):
    """inference-perf's times are perf_counter readings, whose zero Python leaves undefined:
    a load generator on a host booted ``uptime_s`` ago, its report back-dated by an hour (as
    tests/cli/test_import.py does for vLLM's), holds times below zero. They import with the
    same figures as the original; the clock is faked by shifting the readings, not waited on.
    (Issue 35, item 1: the cbbench result importer had refused such times.)"""
    rows = json.loads(INFERENCE_PERF.read_text())
    first = min(e["start_time"] for e in rows)
    # perf_counter at the first send reads uptime_s - 3600: below zero under an hour's uptime
    shifted = _shift_clock(json.loads(INFERENCE_PERF.read_text()), first - (uptime_s - 3600.0))
    assert (min(e["start_time"] for e in shifted) < 0) == (uptime_s < 3600)
    src = tmp_path / "shifted.json"
    src.write_text(json.dumps(shifted))
    res, got = _import(src, "inference-perf", tmp_path / "s.json")
    assert res.exit_code == 0, res.output
    _, want = _import(INFERENCE_PERF, "inference-perf", tmp_path / "o.json")
    for key in ("ttft_ms", "e2el_ms", "tpot_ms", "output_tokens"):
        assert [r[key] for r in got["requests"]] == pytest.approx(
            [r[key] for r in want["requests"]], abs=1e-6), key
    assert got["summary"]["duration_s"] == pytest.approx(want["summary"]["duration_s"])
    assert got["summary"]["itl_ms"]["mean"] == pytest.approx(want["summary"]["itl_ms"]["mean"])


# ---- what reads an imported result ---------------------------------------------------------
def test_compare_gate_report_and_export_read_the_imports(tmp_path):
    g = tmp_path / "g.json"
    i = tmp_path / "i.json"
    assert _import(GUIDELLM, "guidellm", g, "--benchmark", "0")[0].exit_code == 0
    assert _import(INFERENCE_PERF, "inference-perf", i)[0].exit_code == 0
    cmp = runner.invoke(app, ["compare", str(g), str(i)])
    assert cmp.exit_code == 0 and "ttft" in cmp.output.lower(), cmp.output
    same = runner.invoke(app, ["gate", str(i), "--baseline", str(i)])
    assert same.exit_code == 0 and "gate: passed" in same.stdout, same.output
    # g's output throughput (12 tokens over 2 s) is 45% below i's (11 over 1 s): a regression.
    worse = runner.invoke(app, ["gate", str(g), "--baseline", str(i),
                                "--allow-different-workload"])
    assert worse.exit_code == 1 and "REGRESSED" in worse.stdout, worse.output
    rep = runner.invoke(app, ["report", str(g), str(i), "--out", str(tmp_path / "rep")])
    assert rep.exit_code == 0, rep.output
    assert (tmp_path / "rep" / "report.html").stat().st_size > 0
    for f in (g, i):
        br = runner.invoke(app, ["export", str(f), "--format", "csv",
                                 "--out", str(tmp_path / f"{f.stem}.csv")])
        assert br.exit_code == 0, br.output


# ---- AIPerf's reasoning figures and wall clock ---------------------------------------------
def test_aiperf_reasoning_and_clock_carry_over(tmp_path):
    base = 1_796_000_000 * 10**9  # AIPerf stamps time.time_ns()
    metrics = {
        "time_to_first_token": {"value": 40.0, "unit": "ms"},
        "time_to_first_output_token": {"value": 70.0, "unit": "ms"},
        "inter_chunk_latency": {"value": [30.0, 10.0], "unit": "ms"},
        "output_sequence_length": {"value": 3, "unit": "tokens"},
        "input_sequence_length": {"value": 10, "unit": "tokens"},
        "usage_reasoning_tokens": {"value": 1, "unit": "tokens"},
    }
    line = {"metadata": {"x_request_id": "abc", "credit_issued_ns": base,
                         "request_start_ns": base + 5_000_000, "request_end_ns": base + 10**8,
                         "benchmark_phase": "profiling"}, "metrics": metrics, "error": None}
    src = tmp_path / "profile_export.jsonl"
    src.write_text(json.dumps(line) + "\n")
    res, result = _import(src, "aiperf", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    r = result["requests"][0]
    assert r["reasoning_tokens"] == 1
    assert r["ttfot_ms"] == pytest.approx(75.0)  # 70 ms from the send, 5 ms after the release
    assert r["ttft_ms"] == pytest.approx(45.0)
    # The records' zero on the Unix clock: audit compares them with a server log on it.
    assert result["summary"]["http"]["t0_epoch_s"] == pytest.approx(base / 1e9)
    res, g = _import(GUIDELLM, "guidellm", tmp_path / "g.json", "--benchmark", "0")
    assert g["summary"]["http"]["t0_epoch_s"] == pytest.approx(1700000000.0)


# ---- issue 37, rule 3: imported numbers are checked like measured ones ------------------------
def _guidellm(mutate) -> dict:
    data = json.loads(GUIDELLM.read_text())
    mutate(data["benchmarks"][0]["requests"]["successful"][0])
    return data


def _inference_perf(mutate) -> list:
    data = json.loads(INFERENCE_PERF.read_text())
    mutate(data[0])
    return data


def _set(path: str, value):
    def mutate(obj):
        *head, last = path.split(".")
        for k in head:
            obj = obj[k]
        obj[last] = value
    return mutate


def _shift_first_token_back(r):
    r["info"]["timings"]["first_token_iteration"] = r["info"]["timings"]["request_start"] - 1000


@pytest.mark.parametrize(("tool", "build", "says"), [
    # Backward times: imported as TTFT -999,900 ms, exit 0.
    ("guidellm", lambda: _guidellm(_shift_first_token_back), "times run backwards"),
    ("inference-perf", lambda: _inference_perf(_set("info.response_metrics.chunk_times",
                                                    [900.0, 901.0])), "backwards"),
    # 10^11 token events in a 15 KB file asked numpy for 745 GiB.
    ("guidellm", lambda: _guidellm(lambda r: (_set("info.timings.token_iterations", 10**11)(r),
                                              _set("output_metrics.text_tokens", 10**11)(r))),
     "not a token count"),
    # Lists where objects belong, a dict as a name, a 10^400 integer: tracebacks.
    ("guidellm", lambda: _guidellm(_set("info", [1, 2])), "guidellm"),
    ("guidellm", lambda: _guidellm(_set("output_metrics", [1])), "guidellm"),
    ("guidellm", lambda: _guidellm(_set("response_id", {"a": 1})), "not a string"),
    ("inference-perf", lambda: _inference_perf(_set("info.lora_adapter", {"a": 1})),
     "inference-perf"),
    ("inference-perf", lambda: _inference_perf(_set("info", [1])), "inference-perf"),
    ("inference-perf", lambda: _inference_perf(_set("info.response_metrics", [1])),
     "inference-perf"),
    ("inference-perf", lambda: _inference_perf(
        _set("request", json.dumps({"model": {"lora": 1}, "prompt": "x", "stream": True}))),
     "inference-perf"),
    ("inference-perf", lambda: _inference_perf(_set("info.response_metrics.output_tokens",
                                                     10**400)), "401 digits"),
])
def test_a_hostile_import_fails_in_one_line(tmp_path, tool, build, says):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(build()))
    extra = ("--benchmark", "0") if tool == "guidellm" else ()
    res, _ = _import(src, tool, tmp_path / "o.json", *extra)
    _one_line(res, says)
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_an_import_that_never_ends_is_refused(tmp_path, kind):
    """A FIFO with no writer hung the import until killed; /dev/zero was read without end."""
    import os
    import subprocess

    from helpers import CBBENCH

    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    for tool in ("aiperf", "guidellm"):
        out = subprocess.run([*CBBENCH, "import", path, "--from", tool, "--out",
                              str(tmp_path / "o.json")], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 2 and "not a file" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
