"""`--workers auto` at the default `--request-rate inf` (a burst): the schedule has no rate to
keep, so it is not calibrated and auto sends it from one process. It raised OverflowError
("cannot convert float infinity to integer"): schedule_rate said inf for a burst, where its
docstring says 0, and ClientCost.workers_for took ceil(inf)."""

from __future__ import annotations

import json

from helpers import invoke_app

from cbbench.distributed.client_cost import schedule_rate

N = 20


def _workload(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "output_len": 2}) + "\n"
                            for i in range(N)))
    return path


def test_a_burst_has_no_rate():
    assert schedule_rate([0.0, 0.0, 0.0]) == 0.0 and schedule_rate([]) == 0.0


def test_run_workers_auto_sends_a_burst_from_one_process(fake_server, tmp_path):
    out = tmp_path / "r.json"
    res = invoke_app(["run", "--endpoint", fake_server.url, "--workload",
                      str(_workload(tmp_path)), "--num-requests", str(N), "--workers", "auto",
                      "--output", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["config"]["workers"] == 1 and r["config"]["workers_requested"] == "auto"
    assert r["summary"]["completed"] == N
    assert "client_calibration" not in r["summary"]["http"]


def test_sweep_workers_auto_at_rate_inf(fake_server, tmp_path):
    out = tmp_path / "sweep"
    res = invoke_app(["sweep", "--endpoint", fake_server.url, "--workload",
                      str(_workload(tmp_path)), "--rates", "inf", "--skip-warmup",
                      "--workers", "auto", "--num-requests", str(N), "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    (point,) = [p for p in out.glob("*.json") if p.name != "sweep.json"]
    r = json.loads(point.read_text())
    assert r["summary"]["completed"] == N and r["config"]["workers"] == 1


def _said(text: str) -> str:
    """Help or doc text as one line: rich's box edges and wrapping taken out."""
    return " ".join(text.replace("│", " ").split())


def test_help_and_docs_say_what_auto_does():
    """They said "one per spare core" (help) and "one per core, less one" (docs), while auto
    takes as many processes as the calibrated schedule needs: one at 350 req/s or less."""
    from pathlib import Path

    from cbbench.distributed.run import CALIBRATE_ABOVE_RATE

    assert round(CALIBRATE_ABOVE_RATE) == 350
    doc = _said((Path(__file__).parents[2] / "docs" / "load-generation.md").read_text())
    assert "one per core, less one" not in doc
    assert "at most the cores this process may use: above 350 req/s" in doc
    for command in ("run", "sweep", "capacity"):
        res = invoke_app([command, "--help"], env={"COLUMNS": "200"})
        said = _said(res.output)
        assert "spare core" not in said and "calibration of this client's CPU" in said, command
