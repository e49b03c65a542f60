"""`--percentiles` and `--slice` (issue 27) on the simulated engine: the result stores every
percentile asked for (p50, p99.9) and the table shows them; compare, gate and report take the
flag; the slices' counts add up to the whole run's; gate reads `slices.worst.<figure>`; bad
values are one line and exit 2; `--output-format` writes the export beside the result."""

from __future__ import annotations

import csv
import json
import subprocess

import numpy as np
import pytest
from helpers import CBBENCH
from typer.testing import CliRunner

from cbbench.analysis.comparison.gate import WORST_SLICE, direction_of, metric_value
from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.percentiles import (
    parse_percentiles,
    percentile_key,
    split_metric_path,
    with_percentiles_filled,
)
from cbbench.analysis.summary.slices import time_slices
from cbbench.cli.app import app
from cbbench.errors import UsageError
from cbbench.schema import parse_run, to_dict

SIM = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b",
       "--workload", "random", "--input-len", "64", "--output-len", "16"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_keys_and_parsing():
    assert [percentile_key(p) for p in (50, 99.9, 99.0, 0)] == ["p50", "p99.9", "p99", "p0"]
    assert parse_percentiles("99.9, 50,90,50") == (50, 90, 99.9)


def test_close_and_tiny_percentiles_keep_keys_of_their_own(tmp_path):
    """%g keys: 99.99999999 was stored as p100 (one of two percentiles dropped beside 100) and
    0.00001 as p1e-05, which gate then called an unknown metric."""
    asked = (0.00001, 50, 99.99999999, 100)
    assert [percentile_key(p) for p in asked] == ["p0.00001", "p50", "p99.99999999", "p100"]
    path = tmp_path / "p.json"
    out = invoke(*SIM, "--num-requests", "20", "--percentiles", "0.00001,50,99.99999999,100",
                 "--output", str(path))
    assert out.exit_code == 0, out.output
    ttft = json.loads(path.read_text())["summary"]["ttft_ms"]
    assert [k for k in ttft if k.startswith("p")] == ["p0.00001", "p50", "p99.99999999", "p100"]
    out = invoke("gate", str(path), "--baseline", str(path), "--percentiles", "0.00001",
                 "--no-defaults", "--max-regression", "ttft_ms.p0.00001=1%")
    assert out.exit_code == 0 and "gate: passed" in out.output, out.output


@pytest.mark.parametrize("fmt,name", [("csv", "r.csv"), ("parquet", "r.parquet"),
                                      ("csv", "r_summary.csv")])
def test_output_format_refuses_to_replace_the_result_itself(tmp_path, fmt, name):
    """--output r.csv --output-format csv wrote the CSV over the result JSON, exit 0."""
    out = invoke(*SIM, "--num-requests", "2", "--output", str(tmp_path / name),
                 "--output-format", fmt)
    assert out.exit_code == 2
    assert out.output == (f"cbbench: error: --output-format {fmt} writes {tmp_path / name}, "
                          "the result's own path: give --output a .json name\n")
    assert list(tmp_path.iterdir()) == []
    assert parse_percentiles(None) == (50, 90, 95, 99)
    assert split_metric_path("ttft_ms.p99.9") == ["ttft_ms", "p99.9"]
    assert split_metric_path("slices.worst.tpot_ms.p50") == ["slices", "worst", "tpot_ms", "p50"]


@pytest.mark.parametrize("bad", ["", "50,,99", "fifty", "101", "-1", "nan", "50,inf"])
def test_bad_percentiles_are_refused(bad):
    with pytest.raises(UsageError, match="--percentiles"):
        parse_percentiles(bad)


@pytest.mark.parametrize("bad", ["fifty", "101"])
def test_bad_percentiles_are_one_line_exit_2(bad):
    out = subprocess.run([*CBBENCH, *SIM, "--num-requests", "2", "--percentiles", bad,
                          "--output", "/dev/null"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("cbbench: error: --percentiles") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    d = tmp_path_factory.mktemp("slices")
    res = d / "run.json"
    out = invoke(*SIM, "--num-requests", "200", "--request-rate", "40", "--percentiles",
                 "50,90,99,99.9", "--slice", "1s", "--output", str(res),
                 "--output-format", "csv")
    assert out.exit_code == 0, out.output
    return json.loads(res.read_text()), out.output, d


def test_every_percentile_asked_is_stored_and_shown(sliced):
    result, table, _ = sliced
    s = result["summary"]
    assert result["config"]["percentiles"] == [50, 90, 99, 99.9]
    ttft = [r["ttft_ms"] for r in result["requests"] if r["ttft_ms"] is not None]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert {"p50", "p90", "p99", "p99.9"} <= set(s[key]) and "p95" not in s[key]
    assert s["ttft_ms"]["p99.9"] == pytest.approx(float(np.percentile(ttft, 99.9)))
    header = next(line for line in table.splitlines() if "p99.9" in line)
    assert header.split() == ["mean", "p50", "p90", "p99", "p99.9"]


def test_slices_add_up_to_the_whole_run(sliced):
    result, table, _ = sliced
    s = result["summary"]
    slices = s["slices"]
    assert len(slices) >= 5 and slices[0]["start_s"] == 0.0
    assert all(a["end_s"] == b["start_s"] for a, b in zip(slices, slices[1:]))
    assert slices[-1]["end_s"] == pytest.approx(s["duration_s"])
    assert sum(x["completed"] for x in slices) == s["completed"]
    assert sum(x["failed"] for x in slices) == s["failed"]
    assert sum(x["output_tokens"] for x in slices) == s["total_output_tokens"]
    assert all("p99.9" in x["ttft_ms"] for x in slices)
    assert "slice (s)" in table


def test_output_format_writes_the_export_beside(sliced):
    result, _, d = sliced
    rows = list(csv.DictReader((d / "run.csv").read_text().splitlines()))
    assert len(rows) == len(result["requests"])
    assert [float(r["ttft_ms"]) for r in rows] == [r["ttft_ms"] for r in result["requests"]]
    assert (d / "run_summary.csv").exists()


def test_gate_on_the_worst_slice(sliced, tmp_path):
    result, _, d = sliced
    slices = result["summary"]["slices"]
    worst = max(x["ttft_ms"]["p99"] for x in slices if x["ttft_ms"]["p99"] is not None)
    assert metric_value(result, "slices.worst.ttft_ms.p99", "r") == worst
    slowest = min(x["request_throughput"] for x in slices)
    assert metric_value(result, "slices.worst.request_throughput", "r") == slowest
    assert direction_of(WORST_SLICE + "request_throughput") == "higher"
    # A new run whose worst slice is 20% slower regresses; the same run holds.
    worse = json.loads(json.dumps(result))
    for x in worse["summary"]["slices"]:
        if x["ttft_ms"]["p99"] is not None:
            x["ttft_ms"]["p99"] *= 1.2
    new = tmp_path / "new.json"
    new.write_text(json.dumps(worse))
    base = d / "run.json"
    args = ["gate", str(new), "--baseline", str(base), "--no-defaults", "--max-regression",
            "slices.worst.ttft_ms.p99=10%"]
    out = invoke(*args)
    assert out.exit_code == 1 and "REGRESSED" in out.output, out.output
    assert invoke("gate", str(base), "--baseline", str(base), "--no-defaults",
                  "--max-regression", "slices.worst.ttft_ms.p99=10%").exit_code == 0


def test_gate_compare_report_take_percentiles(sliced, tmp_path):
    _, _, d = sliced
    base = str(d / "run.json")
    out = invoke("gate", base, "--baseline", base, "--percentiles", "50,99.9")
    assert out.exit_code == 0 and "ttft_ms.p99.9" in out.output, out.output
    out = invoke("compare", base, base, "--percentiles", "50,99.9")
    assert out.exit_code == 0 and "TTFT p99.9 (ms)" in out.output, out.output
    out = invoke("report", base, "--out", str(tmp_path / "rep"), "--percentiles", "99.9")
    assert out.exit_code == 0, out.output
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "TTFT p99.9 (ms)" in page and 'data-plot="plot-time_slices"' in page


def test_a_stored_percentile_is_recomputed_from_the_requests(sliced):
    result, _, _ = sliced
    filled = to_dict(with_percentiles_filled(parse_run(result, "the result"), (75,), "the result"))
    ttft = [r["ttft_ms"] for r in result["requests"] if r["ttft_ms"] is not None]
    assert filled["summary"]["ttft_ms"]["p75"] == pytest.approx(float(np.percentile(ttft, 75)))
    assert "p75" not in result["summary"]["ttft_ms"]  # the input is left as it was


def _without_p99(result: dict) -> dict:
    """``result`` as a run with --percentiles 50,90,99.9 would have stored it: no p99 anywhere."""
    out = json.loads(json.dumps(result))
    out["config"]["percentiles"] = [50, 90, 99.9]
    for node in [out["summary"], *out["summary"]["slices"]]:
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            node[name].pop("p99", None)
    return out


def test_gate_computes_a_worst_slice_percentile_the_run_did_not_store(sliced, tmp_path):
    # --percentiles 50,99.9 with --slice, then gate ... slices.worst.ttft_ms.p99=10%: exit 2
    # "has no value for metric", where docs/metrics.md says a percentile a threshold reads that
    # a result did not store is computed from its per-request figures.
    result, _, _ = sliced
    stored = {name: max(x[name]["p99"] for x in result["summary"]["slices"]
                        if x[name]["p99"] is not None) for name in ("ttft_ms", "e2el_ms")}
    path = tmp_path / "no_p99.json"
    path.write_text(json.dumps(_without_p99(result)))
    for name, worst in stored.items():
        metric = f"slices.worst.{name}.p99"
        out = invoke("gate", str(path), "--baseline", str(path), "--no-defaults",
                     "--max-regression", f"{metric}=10%")
        assert out.exit_code == 0, out.output
        row = next(line for line in out.output.splitlines() if line.startswith(metric))
        assert float(row.split()[2].replace(",", "")) == pytest.approx(worst, abs=0.005)
    from cbbench.analysis.summary.slice_percentiles import with_slice_percentiles_filled

    filled = with_slice_percentiles_filled(parse_run(_without_p99(result), "r"),
                                           [("ttft_ms", 99)], "r")
    assert metric_value(filled, "slices.worst.ttft_ms.p99", "r") == pytest.approx(
        stored["ttft_ms"], rel=1e-12)
    # ITL needs the per-token lists (--save-detailed), which this run did not keep: one line
    # that says so, not "has no value".
    out = invoke("gate", str(path), "--baseline", str(path), "--no-defaults",
                 "--max-regression", "slices.worst.itl_ms.p99=10%")
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "did not store it in its slices" in lines[0], lines
    assert "--save-detailed" in lines[0] and "50,90,99.9" in lines[0]


def test_slices_by_hand():
    # Three requests: one ends at 0.5 s, one streams over 0.8-1.6 s, one fails at 2.2 s.
    a = RequestRecord(0, 10, 2, 0.0, send_s=0.0, token_times_s=[0.3, 0.5])
    b = RequestRecord(1, 10, 4, 0.7, send_s=0.7, token_times_s=[0.8, 1.0, 1.2, 1.6])
    c = RequestRecord(2, 10, 0, 2.0, send_s=2.0, error="boom", error_type="http_status")
    c.token_times_s = []
    s = time_slices([a, b, c], 2.5, 1.0)
    assert [(x["start_s"], x["end_s"]) for x in s] == [(0.0, 1.0), (1.0, 2.0), (2.0, 2.5)]
    assert [x["completed"] for x in s] == [1, 1, 0]
    assert [x["failed"] for x in s] == [0, 0, 1]
    assert [x["output_tokens"] for x in s] == [2 + 1, 3, 0]  # b's first token in slice 0
    assert s[2]["error_types"] == {"http_status": 1}
    # In flight over [0, 1): a for 0.5 s, b for 0.3 s.
    assert s[0]["in_flight"] == pytest.approx(0.8) and s[0]["in_flight_max"] == 1


def test_bad_slice_is_one_line():
    out = subprocess.run([*CBBENCH, *SIM, "--num-requests", "2", "--slice", "soon",
                          "--output", "/dev/null"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("cbbench: error: invalid --slice")


def test_output_format_and_server_log_refused_before_the_run(tmp_path):
    out = invoke(*SIM, "--num-requests", "2", "--output", "-", "--output-format", "csv")
    assert out.exit_code == 2 and "--output-format writes a file beside the result" in out.output
    out = invoke(*SIM, "--num-requests", "2", "--output", str(tmp_path / "r.json"),
                 "--server-log", str(tmp_path / "log.jsonl"))
    assert out.exit_code == 2 and "--server-log splits an endpoint run's TTFT" in out.output
    out = invoke(*SIM, "--num-requests", "2", "--output", str(tmp_path / "r.json"),
                 "--output-format", "xml")
    assert out.exit_code == 2 and "--output-format must be one of" in out.output
    assert not (tmp_path / "r.json").exists()


def test_gate_on_slices_of_a_result_without_them(sliced, tmp_path):
    result, _, _ = sliced
    plain = {**result, "summary": {k: v for k, v in result["summary"].items() if k != "slices"}}
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(plain))
    out = invoke("gate", str(path), "--baseline", str(path), "--no-defaults",
                 "--max-regression", "slices.worst.ttft_ms.p99=10%")
    assert out.exit_code == 2 and "run with --slice" in out.output
    out = invoke("gate", str(path), "--baseline", str(path), "--no-defaults",
                 "--max-regression", "slices.worst.kv_usage=10%")
    assert out.exit_code == 2 and "unknown metric" in out.output


# ---- issue 37, rule 4: a finished run is never lost to a side product ---------------------------
def test_a_slice_too_short_is_refused_before_the_run(tmp_path):
    """The attack: `--slice 1e-7s` was checked only after the run (1.5e8 slices of a 15 s run):
    exit 2 and nothing written. Now refused with the options, before any engine is built."""
    res = tmp_path / "r.json"
    out = invoke(*SIM, "--num-requests", "4", "--slice", "1e-7s", "--output", str(res))
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: --slice 1e-7s is shorter")
    assert not res.exists()


def test_slices_that_cannot_be_made_after_the_run_cost_only_the_slices(tmp_path, monkeypatch):
    """Past MAX_SLICES once the run's length is known: the result is written without them,
    with a warning (it was exit 2 with no result)."""
    import cbbench.analysis.summary.slices as S

    monkeypatch.setattr(S, "MAX_SLICES", 1)
    res = tmp_path / "r.json"
    out = invoke(*SIM, "--num-requests", "40", "--request-rate", "40", "--slice", "10ms",
                 "--output", str(res))
    assert out.exit_code == 0, out.output
    data = json.loads(res.read_text())
    assert data["summary"]["completed"] == 40 and "slices" not in data["summary"]


# ---- every per-group table holds the asked percentiles (the sixth review) ---------------------
ASKED = "50,99.9"
ASKED_KEYS = {"mean", "std", "p50", "p99.9", "count"}


def _linear(values, q: float) -> float:
    """numpy's default percentile by hand: the value at rank q/100 * (n - 1) of the sorted
    values, linearly between its two neighbours."""
    v = sorted(values)
    rank = q / 100 * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (rank - lo) * (v[hi] - v[lo])


def test_by_turn_and_sessions_hold_the_asked_percentiles():
    """`run --engine sim --workload sharegpt-multiturn --num-requests 3 --think-time 10
    --percentiles 50,99.9`: by_turn and every sessions distribution held p50/p90/p95/p99."""
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    result = execute_run(run_spec(workload="sharegpt-multiturn", num_requests=3,
                                  think_time="10", percentiles=ASKED,
                                  engine=EngineArgs(engine="sim", gpu="h200",
                                                    model="llama-3-8b")))
    s = to_dict(result)["summary"]
    assert set(s["ttft_ms"]) == ASKED_KEYS
    assert s["by_turn"]
    for t in s["by_turn"]:
        assert set(t["ttft_ms"]) == set(t["tpot_ms"]) == ASKED_KEYS
        ttfts = [r.ttft_ms for r in result.requests if r.turn == t["turn"] and r.ttft_ms]
        assert t["ttft_ms"]["p99.9"] == pytest.approx(_linear(ttfts, 99.9), rel=1e-12)
    ses = s["sessions"]
    for name in ("duration_s", "mean_ttft_ms", "time_in_tools_s", "time_in_model_s",
                 "time_in_subagents_s"):
        assert set(ses[name]) == ASKED_KEYS, name
    assert ses["ttft_by_turn_kind_ms"]
    for d in ses["ttft_by_turn_kind_ms"].values():
        assert set(d) == ASKED_KEYS
    # Each session: from its first turn's intended start to its last token.
    spans: dict = {}
    for r in result.requests:
        end = r.intended_start_s + r.e2el_ms / 1000
        a, b = spans.get(r.session_id, (r.intended_start_s, end))
        spans[r.session_id] = (min(a, r.intended_start_s), max(b, end))
    assert ses["completed"] == len(spans) == 3
    assert ses["duration_s"]["p99.9"] == pytest.approx(
        _linear([b - a for a, b in spans.values()], 99.9), rel=1e-9)


def test_by_endpoint_holds_the_asked_percentiles():
    """Two --endpoint URLs and --percentiles 50,99.9: summary.by_endpoint held p50/.../p99."""
    from fake_openai import FakeOpenAI
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.targets.options import EndpointOptions

    with FakeOpenAI() as one, FakeOpenAI() as two:
        result = execute_run(run_spec(
            workload="random", input_len=32, output_len=4, num_requests=10,
            request_rate=100.0, percentiles=ASKED,
            endpoint=EndpointOptions(endpoint=f"{one.url},{two.url}", request_timeout_s=30.0)))
    by = to_dict(result)["summary"]["by_endpoint"]
    assert set(by) == {one.url, two.url}
    for url, split in by.items():
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            assert set(split[name]) == ASKED_KEYS, (url, name)
        ttfts = [r.ttft_ms for r in result.requests if r.endpoint == url]
        assert len(ttfts) == 5
        # five values: rank 0.999 * 4 = 3.996, between the 4th and the 5th
        assert split["ttft_ms"]["p99.9"] == pytest.approx(_linear(ttfts, 99.9), rel=1e-12)


def test_per_priority_holds_the_asked_percentiles():
    from cbbench.analysis.summary.metrics import summarize

    def rec(i, prio, ttft_s):
        return RequestRecord(i, 4, 2, 0.0, token_times_s=[ttft_s, ttft_s + 0.01], priority=prio)

    # priority 0: TTFT 100, 200, 400 ms; priority 1: 1000, 3000 ms
    recs = [rec(0, 0, 0.1), rec(1, 0, 0.2), rec(2, 0, 0.4), rec(3, 1, 1.0), rec(4, 1, 3.0)]
    pp = summarize(recs, 5.0, percentiles=(50, 99.9))["per_priority"]
    # rank 0.999 * 2 = 1.998: 200 + 0.998 * 200; of two: 1000 + 0.999 * 2000
    assert pp["0"]["ttft_ms"] == pytest.approx({"mean": 700 / 3, "p50": 200.0,
                                                "p99.9": 200 + 0.998 * 200})
    assert pp["1"]["ttft_ms"] == pytest.approx({"mean": 2000.0, "p50": 2000.0,
                                                "p99.9": 1000 + 0.999 * 2000})
    assert set(pp["0"]["tpot_ms"]) == {"mean", "p50", "p99.9"}
    # The default list keeps the table's short form: mean, p50, p99.
    assert set(summarize(recs, 5.0)["per_priority"]["0"]["ttft_ms"]) == {"mean", "p50", "p99"}


def test_kv_transfer_holds_the_asked_percentiles():
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    result = execute_run(run_spec(
        workload="random", input_len=256, output_len=4, num_requests=6, request_rate=2.0,
        percentiles=ASKED,
        engine=EngineArgs(engine="sim", gpu="h100", model="llama-3-8b", disaggregate="1:1")))
    kv = to_dict(result)["summary"]["kv_transfer_ms"]
    assert set(kv) == ASKED_KEYS and kv["count"] == 6
