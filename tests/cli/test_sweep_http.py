"""`cbbench sweep --endpoint` against `cbbench serve --engine sim` over loopback HTTP.

The server runs as its own process, started as a user would start it (the conftest fixture
sim_serve_process).
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cbbench.cli.app import app

NUM_REQUESTS = 20
RATES = "5,10"


def test_sweep_against_cbbench_serve(sim_serve_process, tmp_path):
    server = sim_serve_process.url
    # Short prompts and outputs: each point takes a few seconds of real time.
    workload = tmp_path / "short.jsonl"
    workload.write_text("".join(
        json.dumps({"prompt_len": 16 + i, "output_len": 8 + i % 8}) + "\n" for i in range(40)
    ))
    out = tmp_path / "sweep"
    r = CliRunner().invoke(app, [
        "sweep", "--endpoint", server, "--workload", str(workload), "--rates", RATES,
        "--num-requests", str(NUM_REQUESTS), "--min-duration", "0", "--out-dir", str(out),
    ])
    assert r.exit_code == 0, r.output
    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["rate"] for p in sweep["points"]] == [5.0, 10.0]
    for p in sweep["points"]:
        assert p["completed"] == NUM_REQUESTS and p["failed"] == 0
        assert p["ttft_p99_ms"] is not None and p["tpot_p99_ms"] is not None
    for rate in ("5", "10"):
        result = json.loads((out / f"rate-{rate}.json").read_text())
        assert result["config"]["target"] != "engine"
    assert (out / "latency_throughput.png").is_file()
