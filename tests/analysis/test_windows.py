"""gate and compare with --window steady|all: the steady-state figures instead of the whole
run's, refused where a metric has no windowed value or a result no window."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cbbench.analysis.comparison.windows import select_window
from cbbench.cli.app import app
from cbbench.errors import UsageError
from cbbench.schema import RunResult, to_dict


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A saturated sim run, and copies of it edited to move one window's figures."""
    d = tmp_path_factory.mktemp("w")
    base = d / "base.json"
    res = invoke("run", "--engine", "sim", "--num-requests", "300", "--summary-only",
                 "--output", str(base))
    assert res.exit_code == 0, res.output
    result = json.loads(base.read_text())
    worse_steady = copy.deepcopy(result)
    worse_steady["summary"]["steady_state"]["ttft_ms"]["p99"] *= 1.5
    (d / "worse_steady.json").write_text(json.dumps(worse_steady))
    old = copy.deepcopy(result)
    del old["summary"]["steady_state"]
    (d / "old.json").write_text(json.dumps(old))
    return d


def test_gate_reads_the_window_it_is_given(runs):
    args = ("gate", str(runs / "worse_steady.json"), "--baseline", str(runs / "base.json"))
    assert invoke(*args).exit_code == 0  # the whole run did not move
    res = invoke(*args, "--window", "steady")
    assert res.exit_code == 1
    assert "window: steady state" in res.output and "REGRESSED" in res.output


def test_gate_refuses_what_has_no_window(runs):
    res = invoke("gate", str(runs / "base.json"), "--baseline", str(runs / "base.json"),
                 "--window", "steady", "--max-regression", "engine.num_preemptions=0")
    assert res.exit_code == 2
    assert "engine.num_preemptions has no steady-state value" in res.output
    res = invoke("gate", str(runs / "base.json"), "--baseline", str(runs / "old.json"),
                 "--window", "steady")
    assert res.exit_code == 2 and "has no steady-state summary" in res.output
    res = invoke("gate", str(runs / "base.json"), "--baseline", str(runs / "base.json"),
                 "--window", "middle")
    assert res.exit_code == 2 and "invalid --window 'middle'" in res.output


def test_compare_shows_the_steady_figures(runs):
    res = invoke("compare", str(runs / "base.json"), str(runs / "worse_steady.json"),
                 "--window", "steady")
    assert res.exit_code == 0, res.output
    steady = json.loads((runs / "base.json").read_text())["summary"]["steady_state"]
    assert "window: steady state" in res.output
    assert f"{steady['output_throughput']:,.1f}" in res.output
    assert "(1.50×)" in res.output  # TTFT p99, moved in the steady window only
    assert "iterations" not in res.output  # run-wide engine facts are left out
    res = invoke("compare", str(runs / "base.json"), str(runs / "worse_steady.json"))
    assert "(1.50×)" not in res.output and "iterations" in res.output


def test_select_window_keeps_config_and_drops_run_wide_facts(runs):
    result = json.loads((runs / "base.json").read_text())
    view = select_window(result, "steady", "x")
    assert isinstance(view, RunResult)
    written = to_dict(view)  # what a windowed view holds, as the file's JSON
    assert written["config"] == result["config"]
    assert "engine" not in written["summary"] and written["summary"]["window_s"]
    assert select_window(result, "all", "x") is result
    result["summary"]["steady_state"] = {"window_s": None, "note": "empty window: ..."}
    with pytest.raises(UsageError, match="no steady-state window"):
        select_window(result, "steady", "x")
