"""`cbbench compare`: the side-by-side table, config differences, exports, and --variants."""

from __future__ import annotations

import copy
import csv
import json
import re

import pytest
from helpers import run_spec
from typer.testing import CliRunner

from cbbench.analysis.comparison.compare import Labeled, config_differences
from cbbench.analysis.result import write_result
from cbbench.bench.runner import execute_run
from cbbench.bench.variants import parse_variant, parse_variants
from cbbench.cli.app import app as cli_app
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.schema import to_dict

# The real app: its command classes hold the one bad-input boundary (exit 2).
app = cli_app


runner = CliRunner()


@pytest.fixture(scope="module")
def result() -> dict:
    """The result file's JSON: the tests tamper with it and write it back."""
    spec = run_spec(num_requests=60, engine=EngineArgs(engine="sim"))
    return to_dict(execute_run(spec))


def _pair(tmp_path, result) -> tuple[str, str]:
    faster = copy.deepcopy(result)
    faster["summary"]["output_throughput"] = result["summary"]["output_throughput"] * 2
    faster["config"]["scheduler"] = "static"
    faster["config"]["command"] = "cbbench run --something-else"
    a, b = tmp_path / "first.json", tmp_path / "second.json"
    write_result(a, result)
    write_result(b, faster)
    return str(a), str(b)


def test_two_files_give_a_table_with_ratios(tmp_path, result):
    a, b = _pair(tmp_path, result)
    r = runner.invoke(app, ["compare", a, b])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["metric", "first", "second"]
    row = next(ln for ln in lines if ln.startswith("output throughput"))
    assert "(2.00×)" in row
    assert "(1.00×)" in next(ln for ln in lines if ln.startswith("TTFT p99"))
    # Config differences: the scheduler, but not the command line.
    diff = r.stdout.split("config ")[1]
    assert "scheduler" in diff and "static" in diff
    assert "command" not in diff


def test_results_of_different_loads_get_a_note(tmp_path, result):
    other = copy.deepcopy(result)
    other["config"]["seed"] = 3
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_result(a, result)
    write_result(b, other)
    r = runner.invoke(app, ["compare", str(a), str(b)])
    assert r.exit_code == 0
    assert "not like for like" in r.stdout


def test_markdown_and_csv_exports(tmp_path, result):
    a, b = _pair(tmp_path, result)
    md, table = tmp_path / "cmp.md", tmp_path / "cmp.csv"
    r = runner.invoke(app, ["compare", a, b, "--markdown", str(md), "--csv", str(table)])
    assert r.exit_code == 0, r.output
    text = md.read_text()
    assert "| metric" in text and "(2.00×)" in text and "scheduler" in text
    rows = list(csv.DictReader(table.open()))
    out = next(row for row in rows if row["path"] == "output_throughput")
    assert float(out["second/first"]) == pytest.approx(2.0)
    assert float(out["first"]) == pytest.approx(result["summary"]["output_throughput"])
    assert next(row for row in rows if row["path"] == "completed")["first"] == "60"


def test_config_differences_flatten_nested_keys(result):
    other = copy.deepcopy(result)
    other["config"]["efficiency"]["eta_memory"] = 0.7
    other["config"]["command"] = "different"
    diffs = config_differences([Labeled("a", result), Labeled("b", other)])
    assert [d[0] for d in diffs] == ["efficiency.eta_memory"]


def test_a_run_without_slo_reads_none_beside_the_others_limits(tmp_path):
    """`compare a.json b.json`, b run with --slo ttft=200,tpot=20 and a without (its config's
    slo is {}): the table said `slo  {}  (absent)`, then `slo.ttft  (absent)  200`, as if a's
    file had no slo. One key per limit, "(none)" where a run had no limits."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    common = ["run", "--engine", "sim", "--quiet", "--num-requests", "5"]
    assert runner.invoke(app, [*common, "--output", str(a)]).exit_code == 0
    out = runner.invoke(app, [*common, "--slo", "ttft=200,tpot=20", "--output", str(b)])
    assert out.exit_code == 0, out.output
    assert json.loads(a.read_text())["config"]["slo"] == {}
    assert json.loads(b.read_text())["config"]["slo"] == {"ttft": 200.0, "tpot": 20.0}
    out = runner.invoke(app, ["compare", str(a), str(b)])
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.output.split("\nconfig ")[1].splitlines()[2:4]]
    assert rows == [["slo.ttft", "(none)", "200"], ["slo.tpot", "(none)", "20"]]
    assert "(absent)" not in out.output and "{}" not in out.output


def test_config_keys_of_an_empty_dict_and_of_an_older_file():
    """A nested key under an empty dict reads "(none)"; one the file lacks, "(absent)"; two
    empty dicts, or an empty dict against a file without the key, are no difference."""
    from cbbench.schema import parse_run

    def run(**cfg):
        return Labeled(str(cfg), parse_run({"schema_version": 1, "config": cfg,
                                            "summary": {}}, "test"))

    assert config_differences([run(slo={}), run(slo={"ttft": 1.0})]) == [
        ["slo.ttft", "(none)", "1"]]
    assert config_differences([run(), run(slo={"ttft": 1.0})]) == [
        ["slo.ttft", "(absent)", "1"]]
    assert config_differences([run(slo={}), run(slo={})]) == []
    assert config_differences([run(slo={}), run()]) == []


def test_usage_errors(tmp_path, result):
    a, b = _pair(tmp_path, result)
    assert runner.invoke(app, ["compare", a]).exit_code == 2
    assert runner.invoke(app, ["compare"]).exit_code == 2
    both = runner.invoke(app, ["compare", a, b, "--variants", "static,continuous"])
    assert both.exit_code == 2
    missing = runner.invoke(app, ["compare", a, str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "not found" in missing.stderr


# ---- variants -----------------------------------------------------------------------------


def test_variant_names():
    v = parse_variant("continuous-chunked+reserved")
    assert (v.batching, v.chunked_prefill, v.kv_allocation) == ("continuous", True, "reserved")
    v = parse_variant("static")
    assert (v.batching, v.chunked_prefill, v.kv_allocation) == ("static", False, None)
    v = parse_variant("continuous")
    assert (v.batching, v.chunked_prefill) == ("continuous", False)
    v = parse_variant("reserved+static")
    assert (v.batching, v.kv_allocation) == ("static", "reserved")
    v = parse_variant("paged")
    assert (v.batching, v.chunked_prefill, v.kv_allocation) == (None, None, "paged")
    for bad in ("fast", "static+continuous", "paged+reserved", "static+", ""):
        with pytest.raises(UsageError):
            parse_variant(bad)
    with pytest.raises(UsageError):
        parse_variants("static,static")
    with pytest.raises(UsageError):
        parse_variants("static")


def test_a_variant_keeps_the_other_engine_options():
    base = EngineArgs(engine="sim", batching="static", chunked_prefill=True, max_num_seqs=8)
    opts = parse_variant("reserved").apply(base)
    assert (opts.batching, opts.chunked_prefill, opts.kv_allocation) == ("static", True, "reserved")
    assert opts.max_num_seqs == 8


def test_unknown_variant_lists_the_valid_ones(tmp_path):
    r = runner.invoke(
        app, ["compare", "--engine", "sim", "--variants", "static,turbo", "--out-dir", str(tmp_path)]
    )
    assert r.exit_code == 2
    for name in ("static", "continuous", "continuous-chunked", "paged", "reserved"):
        assert name in r.stderr
    assert not list(tmp_path.iterdir())  # nothing ran


def test_variants_run_on_one_request_set(tmp_path):
    out = tmp_path / "cmp"
    r = runner.invoke(
        app,
        # Fewer slots than requests, so static batching has to run several batches.
        ["compare", "--engine", "sim", "--variants", "static,continuous", "--num-requests", "100",
         "--max-num-seqs", "16", "--out-dir", str(out)],
    )
    assert r.exit_code == 0, r.output
    static = json.loads((out / "static.json").read_text())
    cont = json.loads((out / "continuous.json").read_text())
    assert static["config"]["scheduler"] == "static"
    assert cont["config"]["scheduler"] == "continuous"
    assert static["config"]["chunked_prefill"] is False
    assert cont["config"]["chunked_prefill"] is False

    def request_set(res):
        return [(q["id"], q["prompt_tokens"], q["intended_start_s"]) for q in res["requests"]]

    assert sorted(request_set(static)) == sorted(request_set(cont))
    assert static["config"]["max_num_seqs"] == cont["config"]["max_num_seqs"] == 16
    assert cont["summary"]["output_throughput"] > 1.2 * static["summary"]["output_throughput"]
    header = r.stdout.splitlines()[0].split()
    assert header == ["metric", "static", "continuous"]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("output throughput"))
    assert float(re.search(r"\(([\d.]+)×\)", row).group(1)) > 1.2


def test_variants_replay_a_users_file_whole_as_run_does(tmp_path):
    # Without --num-requests, `cbbench run` replays a user's file whole, in order; compare
    # drew 1000 with replacement from a 2-line file, and of a timed trace said "--num-requests
    # 1000 is more", a flag the user never gave.
    untimed, timed = tmp_path / "untimed.jsonl", tmp_path / "timed.jsonl"
    untimed.write_text('{"prompt_len": 16, "output_len": 8}\n{"prompt_len": 20, "output_len": 4}\n')
    timed.write_text('{"prompt_len": 16, "output_len": 8, "arrival_s": 0}\n'
                     '{"prompt_len": 20, "output_len": 4, "arrival_s": 0.01}\n')
    for wl in (untimed, timed):
        out = tmp_path / wl.stem
        r = runner.invoke(app, ["compare", "--engine", "sim", "--variants", "static,continuous",
                                "--workload", str(wl), "--out-dir", str(out)])
        assert r.exit_code == 0, r.output
        for v in ("static", "continuous"):
            res = json.loads((out / f"{v}.json").read_text())
            assert sorted(q["prompt_tokens"] for q in res["requests"]) == [16, 20]


def test_a_small_ratio_keeps_its_significant_digits(tmp_path, result):
    # A 250-fold TTFT drop printed "(0.00×)" with two decimals: the ratio lost every digit.
    faster = copy.deepcopy(result)
    faster["summary"]["ttft_ms"]["p99"] = result["summary"]["ttft_ms"]["p99"] * 0.003988
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_result(a, result)
    write_result(b, faster)
    r = runner.invoke(app, ["compare", str(a), str(b)])
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("TTFT p99"))
    assert "(0.00399×)" in row, row
    from cbbench.analysis.comparison.compare import fmt_ratio

    assert [fmt_ratio(x) for x in (2.0, 1.0, 0.5, 0.0123, 0.0)] == [
        "2.00×", "1.00×", "0.500×", "0.0123×", "0.00×"]


def test_cancelled_requests_have_a_row(tmp_path, result):
    # A --cancel-rate run: completed 161, failed 6 of 200, and its 33 cancelled requests were
    # nowhere in the table.
    cancelled = copy.deepcopy(result)
    cancelled["summary"]["cancelled"] = 33
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_result(a, result)
    write_result(b, cancelled)
    r = runner.invoke(app, ["compare", str(a), str(b)])
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("cancelled"))
    assert row.split()[1:3] == ["0", "33"], row
