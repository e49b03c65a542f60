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


# ---- issue 37, rule 7: every reader of outside files fails in one line (or writes) ----------
def _mutated(src: Path, tmp_path: Path, mutate) -> Path:
    data = json.loads(src.read_text())
    mutate(data)
    out = tmp_path / "mutated.json"
    out.write_text(json.dumps(data))  # NaN and Infinity as Python writes them; \\ud800 escaped
    return out


@pytest.mark.parametrize("key,value", [("tensor_parallel_size", float("inf")),
                                       ("data_parallel_size", float("nan"))])
def test_br02_of_non_finite_sizes_validates(results, tmp_path, key, value):
    """An infinite or NaN parallel size in a result: OverflowError / ValueError tracebacks."""
    src = _mutated(results["plain"], tmp_path, lambda d: d["config"].__setitem__(key, value))
    doc = _export_br(src, tmp_path / "o.br0.2.json")
    _validator().validate(doc)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_lone_surrogates_are_written_as_replacement_characters(results, tmp_path, fmt):
    """A label and an error holding lone surrogates: UnicodeEncodeError tracebacks."""
    def mutate(d):
        d["config"]["label"] = "run-\ud800"
        d["requests"][0]["error"] = "\udcff"

    src = _mutated(results["plain"], tmp_path, mutate)
    out = tmp_path / f"o.{fmt}"
    res = runner.invoke(app, ["export", str(src), "--format", fmt, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.exists()
    if fmt == "csv":
        assert "\ufffd" in out.read_text(encoding="utf-8")


def test_parquet_on_a_full_disk_writes_neither_file(results, tmp_path):
    """A write that fails midway (the disk full: here a file-size limit the sidecar passes,
    EFBIG as ENOSPC would be) left the main Parquet file without its iterations sidecar. Now
    the two are staged together: neither is written, one line, exit 2."""
    import subprocess
    import sys

    ok = tmp_path / "ok"
    ok.mkdir()
    assert _cli("export", str(results["plain"]), "--format", "parquet", "--out",
                str(ok / "r.parquet")).exit_code == 0
    main_size = (ok / "r.parquet").stat().st_size
    side_size = (ok / "r_iterations.parquet").stat().st_size
    assert main_size < side_size, (main_size, side_size)  # the sidecar is the one to fail
    limit = (main_size + side_size) // 2
    out = tmp_path / "full" / "r.parquet"
    out.parent.mkdir()
    code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
            "from cbbench.cli.app import main; main()")
    proc = subprocess.run([sys.executable, "-c", code, "export", str(results["plain"]),
                           "--format", "parquet", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("cbbench: error: cannot write") and \
        len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == []  # no file, no temporary


def test_a_nan_gap_in_a_requests_itl_is_refused_in_one_line(results, tmp_path):
    """A NaN among a request's per-token gaps: json.dumps(allow_nan=False) raised ValueError
    through a 69-line traceback. Now one line names the request, exit 2, no file written."""
    src = _mutated(results["detailed"], tmp_path, lambda d: d["requests"][0]["itl_ms"]
                   .__setitem__(1, float("nan")))
    first_id = json.loads(src.read_text())["requests"][0]["id"]
    out = tmp_path / "o.br0.2.json"
    res = runner.invoke(app, ["export", str(src), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert res.stderr == (f"cbbench: error: request {first_id}: itl_ms holds nan, not a finite "
                          "number of milliseconds: BR0.2 cannot write its statistics\n")
    assert not out.exists()


@pytest.mark.parametrize("field,value", [("token_times_s", [10**30, 1.5]),
                                         ("event_tokens", [2**63])])
def test_parquet_keeps_an_int_beyond_int64_in_a_list_as_json(results, tmp_path, field, value):
    """A list holding an int past int64: pyarrow raised ArrowInvalid/OverflowError. The column
    is now JSON text, as a lone big int's already was, and reads back to the exact values."""
    pq = pytest.importorskip("pyarrow.parquet")
    src = _mutated(results["detailed"], tmp_path,
                   lambda d: d["requests"][0].__setitem__(field, value))
    out = tmp_path / "o.parquet"
    res = runner.invoke(app, ["export", str(src), "--format", "parquet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    column = pq.read_table(out).column(field).to_pylist()
    assert json.loads(column[0]) == value


def test_br02_of_a_summary_only_run_counts_its_failed_requests(tmp_path):
    """--summary-only keeps no records: the total was summary.completed alone (8 of 10, the 2
    rejected left out). The total is now every request counted: completed, failed, cancelled."""
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt_len": 100, "output_len": 10}\n' * 8
                        + '{"prompt_len": 9000, "output_len": 10}\n' * 2)
    result = tmp_path / "fs.json"
    res = _cli("run", "--engine", "sim", "--workload", str(workload), "--summary-only",
               "--max-error-rate", "1", "--output", str(result))
    assert res.exit_code == 0, res.output
    doc = _export_br(result, tmp_path / "fs.br0.2.json")
    requests = doc["results"]["request_performance"]["aggregate"]["requests"]
    assert (requests["total"], requests["failures"]) == (10, 2)


def test_csv_of_a_summary_only_result_is_a_table_a_reader_takes(results, tmp_path):
    """--summary-only keeps no request records: requests.csv was one empty line, which
    pyarrow's (and pandas') CSV reader refuses ("Empty CSV file"). It is the records' header
    and no row: zero requests, every column named."""
    import pyarrow.csv as pc

    from cbbench.schema.run import Request

    data = json.loads(results["plain"].read_text())
    data.pop("requests")
    data.pop("iterations")
    src = tmp_path / "so.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "so.csv"
    res = _cli("export", str(src), "--format", "csv", "--out", str(out))
    assert res.exit_code == 0, res.output
    table = pc.read_csv(out)
    assert table.num_rows == 0 and table.column_names == list(Request.model_fields)
    summary = pc.read_csv(tmp_path / "so_summary.csv")
    assert summary.column_names == ["metric", "statistic", "value"] and summary.num_rows > 0


def test_br02_of_a_summary_only_run_keeps_its_sequence_lengths(tmp_path):
    """--summary-only keeps no records: BR0.2 said the run's input and output sequence lengths
    were 0 (and gave no input_length / output_length), for a run of 100-token prompts and
    10-token answers. llm-d's own vLLM-bench import takes them as the totals over the completed
    requests (total_input_tokens / completed), the summary's totals here."""
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt_len": 100, "output_len": 10}\n' * 4)
    result = tmp_path / "so.json"
    res = _cli("run", "--engine", "sim", "--workload", str(workload), "--summary-only",
               "--output", str(result))
    assert res.exit_code == 0, res.output
    doc = _export_br(result, tmp_path / "so.br0.2.json")
    _validator().validate(doc)
    load = doc["scenario"]["load"]["standardized"]
    assert (load["input_seq_len"]["value"], load["output_seq_len"]["value"]) == (100, 10)
    requests = doc["results"]["request_performance"]["aggregate"]["requests"]
    assert (requests["input_length"]["mean"], requests["output_length"]["mean"]) == (100, 10)


@pytest.mark.parametrize(("workload", "source"), [
    ("unknown", "unknown"),  # what an import writes when the tool's file does not say
    ("random-mm", "random"),  # random tokens (with images): not sampled from data
    ("random", "random"),
    ("sharegpt", "sampled"),
])
def test_br02_load_source_says_how_the_prompts_were_made(workload, source):
    """BR0.2's load.source was "sampled" for an imported run whose workload is unknown (an
    AIPerf file names none) and for random-mm's random tokens. llm-d's LoadSource: random
    (tokens drawn from the vocabulary), sampled (from some data), unknown."""
    from cbbench.export.br02 import to_br02

    result = json.loads((SCHEMA.parent.parent / "results" / "run.json").read_text())
    result["config"]["workload"] = workload
    assert to_br02(result)["scenario"]["load"]["standardized"]["source"] == source


def test_br02_counts_requests_cut_by_the_end_as_incomplete_not_failures():
    """A request still in flight when the run stopped (a run's Ctrl-C, a GuideLLM benchmark's
    end: error_type "interrupted", among the summary's failed) was a BR0.2 failure. llm-d's
    schema: failures "responded with an error", incomplete "not completed"; its GuideLLM
    converter puts GuideLLM's incomplete requests in incomplete and its errored in failures."""
    from cbbench.export.br02 import to_br02

    result = json.loads((SCHEMA.parent.parent / "results" / "run.json").read_text())
    result["summary"].update(failed=3, cancelled=1,
                             error_types={"interrupted": 2, "http_status": 1})
    requests = to_br02(result)["results"]["request_performance"]["aggregate"]["requests"]
    assert (requests["failures"], requests["incomplete"]) == (1, 3)
