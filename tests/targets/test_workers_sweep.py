"""`sweep --workers N` and `capacity --workers N`: every point or probe is a multi-worker run
(the probe's schedule dealt request i to worker i mod N), recorded as such."""

from __future__ import annotations

import json

import pytest
from helpers import invoke_app

from cbbench.analysis.summary.slo import parse_attainment_slo
from cbbench.bench.capacity import Prober
from cbbench.bench.probe import ProbeSizing
from cbbench.cli.sweep import base_spec
from cbbench.engine.args import EngineArgs
from cbbench.options.endpoint import EndpointFlags
from cbbench.options.load import LoadOptions
from cbbench.options.output import OutputOptions

N = 8  # requests per point


def _workload(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "output_len": 2}) + "\n"
                            for i in range(N)))
    return path


def _two_worker_run(result: dict, n: int) -> None:
    s = result["summary"]
    assert result["config"]["workers"] == 2 and len(s["workers"]) == 2
    assert s["completed"] == n == len(result["requests"])
    assert [r["worker"] for r in result["requests"]] == [i % 2 for i in range(n)]
    assert all(w["status"] == "done" and w["sent"] == n // 2 for w in s["workers"])


def test_sweep_points_are_multi_worker_runs(fake_server, tmp_path):
    out = tmp_path / "sweep"
    res = invoke_app([
        "sweep", "--endpoint", fake_server.url, "--workload", str(_workload(tmp_path)),
        "--rates", "20,40", "--num-requests", str(N), "--max-requests", str(N),
        "--min-duration", "0", "--workers", "2", "--out-dir", str(out),
    ])
    assert res.exit_code == 0, res.output
    points = sorted(p for p in out.glob("*.json") if p.name != "sweep.json")
    assert len(points) == 2
    for p in points:
        _two_worker_run(json.loads(p.read_text()), N)
    assert json.loads((out / "sweep.json").read_text())["config"]["workers"] == 2


def test_capacity_probes_are_multi_worker_runs(fake_server, tmp_path):
    base = base_spec(LoadOptions(workload=str(_workload(tmp_path)), seed=0, burstiness=1.0,
                                 arrival="gamma"),
                     OutputOptions(), EndpointFlags(endpoint=fake_server.url, workers="2"),
                     EngineArgs())
    slo = parse_attainment_slo("ttft_p99=10000", None)
    prober = Prober(base, ProbeSizing(N, 0.0, N), slo, runs_dir=tmp_path)
    probe = prober(20.0, "bracket")
    # Met the SLO; 8 requests are too few to judge a steady state, so no pass (capacity.py).
    assert probe.meets_slo and probe.too_short and not probe.passed
    (path,) = tmp_path.glob("probe-1-rate-*.json")
    _two_worker_run(json.loads(path.read_text()), N)


@pytest.mark.parametrize("command", ["sweep", "capacity"])
@pytest.mark.parametrize("args, message", [
    (["--engine", "sim", "--workers", "2"], "--workers and --ray apply to --endpoint runs"),
    (["--endpoint", "http://127.0.0.1:9", "--workers", "0"], "invalid --workers 0"),
])
def test_bad_workers_is_one_line(tmp_path, command, args, message):
    extra = ["--slo", "ttft_p99=1000"] if command == "capacity" else []
    res = invoke_app([command, *args, *extra, "--out" if command == "capacity"
                      else "--out-dir", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert res.output.strip().startswith("cbbench: error: ") and message in res.output
    assert len(res.output.strip().splitlines()) == 1
