"""`cbbench export`: llm-d's Benchmark Report v0.2 (validated against llm-d's own JSON
Schema), and CSV / Parquet exports that read back to the result's exact per-request figures."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import jsonschema
import pytest
from helpers import serve_process
from typer.testing import CliRunner

from cbbench.cli.app import app

SCHEMA = Path(__file__).resolve().parent.parent / "data" / "llm-d" / "br_v0_2_json_schema.json"
SERVE_MODEL = "llama-3.2-1b"
runner = CliRunner()


def _cli(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _run(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / f"{name}.json"
    res = _cli("run", "--engine", "sim", "--workload", "sharegpt", "--num-requests", "40",
               "--request-rate", "20", "--output", str(out), *extra)
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("export")
    return {"plain": _run(tmp, "plain"), "detailed": _run(tmp, "detailed", "--save-detailed")}


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA.read_text())
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _export_br(result: Path, out: Path) -> dict:
    res = _cli("export", str(result), "--format", "br0.2", "--out", str(out))
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_br02_of_an_engine_run_validates_and_equals_the_summary(results, tmp_path):
    report = _export_br(results["plain"], tmp_path / "br.json")
    _validator().validate(report)
    summary = json.loads(results["plain"].read_text())["summary"]
    agg = report["results"]["request_performance"]["aggregate"]
    for br_key, ours in (("time_to_first_token", "ttft_ms"), ("time_per_output_token", "tpot_ms"),
                         ("request_latency", "e2el_ms")):
        stats = agg["latency"][br_key]
        for p in ("p50", "p90", "p95", "p99"):  # the same values, the same interpolation
            assert stats[p] == pytest.approx(summary[ours][p], rel=1e-12), (br_key, p)
        assert stats["mean"] == pytest.approx(summary[ours]["mean"], rel=1e-12)
    assert agg["requests"]["total"] == 40
    assert agg["requests"]["failures"] == summary["failed"]
    assert agg["throughput"]["output_token_rate"]["mean"] == summary["output_throughput"]
    assert agg["throughput"]["input_token_rate"]["mean"] == pytest.approx(
        summary["total_input_tokens"] / summary["duration_s"])
    engine = report["scenario"]["stack"][0]["standardized"]
    assert (engine["kind"], engine["model"]["name"], engine["accelerator"]["model"]) == (
        "inference_engine", "llama-3-8b", "h200")
    assert report["scenario"]["load"]["standardized"]["rate_qps"] == 20.0


def test_br02_itl_comes_from_the_per_token_gaps_when_detailed(results, tmp_path):
    report = _export_br(results["detailed"], tmp_path / "br.json")
    _validator().validate(report)
    summary = json.loads(results["detailed"].read_text())["summary"]
    itl = report["results"]["request_performance"]["aggregate"]["latency"]["inter_token_latency"]
    assert "p0p1" in itl  # computed from the pooled gaps, not only copied from the summary
    for p in ("p50", "p90", "p99"):
        assert itl[p] == pytest.approx(summary["itl_ms"][p], rel=1e-9)


def test_br02_of_an_endpoint_run_validates(tmp_path):
    out = tmp_path / "http.json"
    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200") as server:
        res = _cli("run", "--endpoint", server.url, "--workload", "sharegpt",
                   "--num-requests", "20", "--request-rate", "20", "--output", str(out))
    assert res.exit_code == 0, res.output
    report = _export_br(out, tmp_path / "br.json")
    _validator().validate(report)
    component = report["scenario"]["stack"][0]
    assert component["standardized"]["kind"] == "generic"
    assert report["results"]["request_performance"]["aggregate"]["requests"]["total"] == 20


def test_the_schema_check_can_fail(results, tmp_path):
    """The validation above means something: a report with a unit llm-d does not know fails."""
    report = _export_br(results["plain"], tmp_path / "br.json")
    bad = copy.deepcopy(report)
    bad["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"][
        "units"] = "fortnights"
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(bad)


def _typed(text: str, like):
    """A CSV cell read back as the type the JSON result had."""
    if like is None:
        return None if text == "" else text
    if isinstance(like, bool):
        return text == "True"
    if isinstance(like, (list, dict)):
        return json.loads(text)
    return type(like)(text)


def test_csv_round_trips_every_request_exactly(results, tmp_path):
    src = json.loads(results["detailed"].read_text())
    out = tmp_path / "r.csv"
    res = _cli("export", str(results["detailed"]), "--format", "csv", "--out", str(out))
    assert res.exit_code == 0, res.output
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(src["requests"])
    for row, req in zip(rows, src["requests"]):
        assert {k: _typed(row[k], v) for k, v in req.items()} == req
    with (tmp_path / "r_summary.csv").open(newline="") as f:
        summary_rows = {(r["metric"], r["statistic"]): r["value"] for r in csv.DictReader(f)}
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat, value in src["summary"][key].items():
            assert _typed(summary_rows[(key, stat)], value) == value
    assert float(summary_rows[("output_throughput", "value")]) == src["summary"]["output_throughput"]


def test_parquet_round_trips_requests_and_iterations_exactly(results, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    src = json.loads(results["detailed"].read_text())
    out = tmp_path / "r.parquet"
    res = _cli("export", str(results["detailed"]), "--format", "parquet", "--out", str(out))
    assert res.exit_code == 0, res.output
    requests = pq.read_table(out).to_pylist()
    assert requests == src["requests"]  # ints, floats, lists (ITL, token ids), nulls
    iterations = pq.read_table(tmp_path / "r_iterations.parquet").to_pylist()
    assert iterations == src["iterations"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "xml"], "--format 'xml': use one of br0.2, csv, parquet"),
        (["--out", "{input}"], "is also an input of this command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(results, args, message):
    src = results["plain"]
    before = src.read_bytes()
    res = runner.invoke(app, ["export", str(src), *[a.format(input=src) for a in args]])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error:") and message in lines[0]
    assert src.read_bytes() == before  # the result was not replaced


def test_a_file_that_is_not_a_result_is_refused(tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"hello": 1}')
    res = runner.invoke(app, ["export", str(bogus), "--format", "csv"])
    assert res.exit_code == 2 and "not a cbbench result" in res.output
    assert not (tmp_path / "bogus.csv").exists()
