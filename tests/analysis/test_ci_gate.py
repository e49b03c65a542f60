"""The project's own CI performance gate (.ci/perf_gate.sh) passes on the committed baselines
and fails on a deliberately regressed one: proof that the gate can fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "perf_gate.sh"
BASELINES = ROOT / "results" / "baselines"


def _run_gate(baseline_dir: Path, out_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # The script calls the cbbench console script of this interpreter's environment.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["BASELINE_DIR"] = str(baseline_dir)
    env["OUT_DIR"] = str(out_dir)
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300
    )


def test_gate_passes_on_the_committed_baselines(tmp_path):
    res = _run_gate(BASELINES, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "passed" in res.stdout


def test_gate_fails_on_a_regressed_baseline(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(BASELINES, base)
    # Pretend the baseline was 25% faster: today's identical figures are then a regression.
    path = base / "sim_h200_sharegpt_saturation.json"
    data = json.loads(path.read_text())
    data["summary"]["output_throughput"] *= 1.25
    path.write_text(json.dumps(data))
    res = _run_gate(base, tmp_path / "out")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSED" in res.stdout
    md = (tmp_path / "out" / "saturation.md").read_text()
    assert "output_throughput" in md
