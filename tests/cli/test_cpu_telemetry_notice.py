"""A CPU run has no GPU to read: the run says so once, as information, instead of warning
"GPU telemetry unavailable: NVML Shared Library Not Found" and repeating it in the summary
(issue 35, item 6)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cbbench.analysis.summary.telemetry import CPU_RUN_REASON
from cbbench.cli.app import app


def test_a_cpu_run_says_once_it_has_no_gpu_to_read(tmp_path, notices):
    out = tmp_path / "cpu.json"
    res = CliRunner().invoke(app, ["run", "--workload", "sharegpt", "--num-requests", "2",
                                   "--device", "cpu", "--output", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    said = res.output + "\n".join(notices)
    assert "NVML" not in said and "warning: GPU telemetry" not in said, said
    assert said.count("GPU telemetry") == 1
    assert f"GPU telemetry: unavailable ({CPU_RUN_REASON})" in res.output
    tel = json.loads(out.read_text())["telemetry"]
    assert tel["available"] is False and tel["reason"] == CPU_RUN_REASON
