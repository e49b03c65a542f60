"""BR0.2 fields a --summary-only or imported result got wrong: ``multi_turn`` from what the
summary keeps, and ``run.keywords``, which llm-d reserves for the submitter's curated tags
(llm-d-benchmark SUBMISSION_POLICY.md: "never machine-generated, so a report produced by a run
that set no keywords omits the key entirely"; native_to_br0_2.py writes it only from
--run-keywords)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cbbench.analysis.records import RequestRecord
from cbbench.cli.app import app
from cbbench.export.br02 import to_br02
from cbbench.importers.result import build_result

runner = CliRunner()


def _export(tmp_path: Path, path: Path) -> dict:
    out = tmp_path / "br.json"
    res = runner.invoke(app, ["export", str(path), "--format", "br0.2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_a_summary_only_multi_turn_run_keeps_br02s_multi_turn_flag(tmp_path):
    # Before: the flag was read from the per-request turn numbers alone, so the same run's
    # --summary-only file exported a single-turn load.
    args = ["run", "--engine", "sim", "--workload", "sharegpt-multiturn", "--num-requests", "2",
            "--quiet"]
    full, brief = tmp_path / "full.json", tmp_path / "brief.json"
    for out, extra in ((full, []), (brief, ["--summary-only"])):
        res = runner.invoke(app, [*args, *extra, "--output", str(out)])
        assert res.exit_code == 0, res.output
    assert "requests" not in json.loads(brief.read_text())
    for path in (full, brief):
        load = _export(tmp_path, path)["scenario"]["load"]["standardized"]
        assert load["multi_turn"] == {"enabled": True}, path.name


def test_a_single_turn_summary_only_run_has_no_multi_turn_flag(tmp_path):
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["run", "--engine", "sim", "--workload", "random", "--num-requests",
                              "3", "--summary-only", "--quiet", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "multi_turn" not in _export(tmp_path, out)["scenario"]["load"]["standardized"]


def test_keywords_are_left_to_the_submitter():
    # Before: an imported result's keywords were ["unknown"] (its workload placeholder), a
    # cbbench run's [workload, engine]: machine-made tags in the submitter's field.
    recs = [RequestRecord(id=0, prompt_tokens=4, output_tokens=2, intended_start_s=0.0,
                          token_times_s=[0.1, 0.2])]
    imported = build_result({"target": "http", "workload": "unknown"},
                            "2026-12-08T00:00:00+00:00", recs, 0.2)
    own = build_result({"target": "engine", "workload": "sharegpt", "engine": "sim"},
                       "2026-12-08T00:00:00+00:00", recs, 0.2)
    for result in (imported, own):
        assert "keywords" not in to_br02(result)["run"]
