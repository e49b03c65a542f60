"""gate and compare with --window steady|all: the steady-state figures instead of the whole
run's, refused where a metric has no windowed value or a result no window."""

from __future__ import annotations

import copy
import json

import numpy as np
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


@pytest.fixture(scope="module")
def detailed(tmp_path_factory):
    """A sim run with its request records, paced so that its ramp-up and drain hold requests
    slower than any the steady window served (the whole run's TTFT max is not the window's)."""
    path = tmp_path_factory.mktemp("wd") / "run.json"
    res = invoke("run", "--engine", "sim", "--num-requests", "80", "--request-rate", "20",
                 "--output", str(path))
    assert res.exit_code == 0, res.output
    return path


def test_the_windowed_view_holds_the_requests_its_figures_count(detailed):
    """The view's requests are the steady state's: their percentiles are the stored ones."""
    result = json.loads(detailed.read_text())
    view = select_window(result, "steady", "x")
    ss = result["summary"]["steady_state"]
    assert 0 < len(view.requests) < len(result["requests"])
    ok = [r for r in view.requests if r.error is None and not r.cancelled]
    assert len(ok) == ss["completed"]
    for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
        values = [getattr(r, name) for r in ok if getattr(r, name) is not None]
        for p in (50, 99):
            assert np.percentile(values, p) == pytest.approx(ss[name][f"p{p}"], rel=1e-12)


def test_percentiles_filled_in_the_steady_window_are_the_windows(detailed, tmp_path):
    """--percentiles with --window steady: a percentile the run did not store is computed from
    the window's requests (compare) and found at all (gate), not taken from the whole run."""
    result = json.loads(detailed.read_text())
    a, b = result["summary"]["steady_state"]["window_s"]
    ok = [r for r in result["requests"] if r["error"] is None]
    served = [r["intended_start_s"] + r["ttft_ms"] / 1000 for r in ok]
    window_max = max(r["ttft_ms"] for r, t in zip(ok, served) if a <= t <= b)
    run_max = max(r["ttft_ms"] for r in ok)
    assert window_max < run_max  # else this case could not tell the two apart
    copy_path = tmp_path / "again.json"
    copy_path.write_text(detailed.read_text())
    res = invoke("compare", str(detailed), str(copy_path), "--window", "steady",
                 "--percentiles", "50,100")
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.startswith("TTFT p100"))
    assert f"{window_max:,.2f}" in row and f"{run_max:,.2f}" not in row
    res = invoke("gate", str(copy_path), "--baseline", str(detailed), "--window", "steady",
                 "--percentiles", "75", "--no-defaults", "--max-regression", "ttft_ms.p75=0%")
    assert res.exit_code == 0, res.output
    assert "ttft_ms.p75" in res.output and "gate: passed" in res.output
