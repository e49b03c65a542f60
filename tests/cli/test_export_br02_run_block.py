"""BR0.2 fields a --summary-only or imported result got wrong: ``multi_turn`` from what the
summary keeps, and ``run.keywords``, which llm-d reserves for the submitter's curated tags
(llm-d-benchmark SUBMISSION_POLICY.md: "never machine-generated, so a report produced by a run
that set no keywords omits the key entirely"; native_to_br0_2.py writes it only from
--run-keywords)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cbbench.cli.app import app

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

