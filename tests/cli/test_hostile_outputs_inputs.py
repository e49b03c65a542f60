"""An output is never one of the command's inputs (issue 25, rule 1).

Round 2's guard covered the workload, compare/gate results and the tokenizer; each case here
exited 0 and replaced its input, directly or through a symlink or a hard link, before one guard
(analysis/result.py: check_not_an_input, by resolved path and by inode) was called by every
command for every file it writes, with every file it reads. Each test shows the refusal (one
line, exit 2) and that the input's bytes are unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

SIM = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(res, *texts: str) -> None:
    """One line `cbbench: error: ... is also an input ...`, exit 2."""
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), res.stderr
    assert "is also an input of this command" in lines[0], lines[0]
    for t in texts:
        assert t in lines[0], (t, lines[0])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A sim result, a 'real' run (a sim run's records under a torch/cpu config, as
    calibrate reads them) and a device profile made from it."""
    d = tmp_path_factory.mktemp("io")
    sim = d / "sim.json"
    assert cli("run", *SIM, "--num-requests", "8", "--output", sim).exit_code == 0
    real = json.loads(sim.read_text())
    real["config"].update(engine="torch", device="cpu", device_name="cpu", gpu=None,
                          gpu_spec=None)
    real["iterations"] = real["iterations"] * 10  # enough iterations to fit
    for k, it in enumerate(real["iterations"]):  # varied times: a fit can run
        it["duration_s"] = it["duration_s"] * (1.0 + 0.01 * (k % 7))
    (d / "real.json").write_text(json.dumps(real))
    profile = {
        "kind": "cbbench-device-profile", "version": 1, "device": "h200",
        "device_name": "NVIDIA H200", "dtype": "bf16", "models": ["llama-3-8b"],
        "rates": {"memory_bandwidth": 4.0e12, "flop_rate": 7.0e14,
                  "iteration_overhead_s": 1e-4},
    }
    (d / "profile.json").write_text(json.dumps(profile))
    wl = d / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt_len": 10 + i, "output_len": 4}) + "\n"
                          for i in range(4)))
    return d


def _bytes(*paths: Path) -> list[bytes]:
    return [Path(p).read_bytes() for p in paths]


def test_calibrate_out_over_its_result(files):
    real = files / "real.json"
    before = _bytes(real)
    refused(cli("calibrate", real, "--out", real), "--out")
    link = files / "link-to-real.json"
    link.unlink(missing_ok=True)
    link.symlink_to(real)
    refused(cli("calibrate", real, "--out", link), "--out")
    assert _bytes(real) == before


def test_replay_output_over_the_replayed_result(files):
    """A real GPU run replaced by its own simulation."""
    sim = files / "sim.json"
    before = _bytes(sim)
    refused(cli("run", "--engine", "sim", "--gpu", "h200", "--replay", sim, "--output", sim),
            "--output")
    hard = files / "hard-sim.json"
    hard.unlink(missing_ok=True)
    os.link(sim, hard)
    refused(cli("run", "--engine", "sim", "--gpu", "h200", "--replay", sim, "--output", hard))
    assert _bytes(sim) == before


def test_run_output_over_its_gpu_profile(files):
    p = files / "profile.json"
    before = _bytes(p)
    refused(cli("run", "--engine", "sim", "--gpu-profile", p, "--num-requests", "3",
                "--output", p), "--output")
    assert _bytes(p) == before


def test_capacity_out_over_its_workload_or_profile(files):
    wl, p = files / "w.jsonl", files / "profile.json"
    before = _bytes(wl, p)
    for over in (wl, p):
        refused(cli("capacity", "--engine", "sim", "--gpu-profile", p, "--workload", wl,
                    "--slo", "ttft_p99=1000", "--out", over), "--out")
    assert _bytes(wl, p) == before


def test_capacity_runs_dir_over_an_input_named_like_a_probe(files):
    """Beyond the issue's list: a probe file (probe-<i>-rate-<r>.json) of --runs-dir that is
    the workload."""
    d = files / "runs"
    d.mkdir(exist_ok=True)
    wl = d / "probe-0-rate-1.json"
    wl.write_text((files / "w.jsonl").read_text())
    before = _bytes(wl)
    refused(cli("capacity", *SIM, "--workload", wl, "--slo", "ttft_p99=1000",
                "--out", files / "cap.json", "--runs-dir", d), "--runs-dir")
    assert _bytes(wl) == before


def test_serve_request_log_over_its_profile(files):
    p = files / "profile.json"
    before = _bytes(p)
    refused(cli("serve", "--engine", "sim", "--gpu-profile", p, "--port", "0",
                "--request-log", p), "--request-log")
    assert _bytes(p) == before


def test_report_out_dir_holding_an_input_named_like_a_report_file(files):
    d = files / "rep"
    d.mkdir(exist_ok=True)
    page = d / "report.html"
    if not page.exists():
        os.link(files / "sim.json", page)  # a hard link: the same inode by another name
    before = _bytes(page)
    refused(cli("report", page, "--out", d), "--out")
    assert _bytes(page) == before
    assert sorted(p.name for p in d.iterdir()) == ["report.html"]  # no PNG written either


def test_sweep_out_dir_holding_its_workload_named_sweep_json(files):
    """Beyond the issue's list: `sweep --out-dir D` writes D/sweep.json and D/rate-*.json."""
    d = files / "sw"
    d.mkdir(exist_ok=True)
    wl = d / "sweep.json"
    wl.write_text((files / "w.jsonl").read_text())
    before = _bytes(wl)
    refused(cli("sweep", *SIM, "--workload", wl, "--rates", "1", "--out-dir", d), "--out-dir")
    assert _bytes(wl) == before


def test_a_new_output_beside_its_inputs_still_runs(files, tmp_path):
    """The guard refuses only what replaces an input: a new file next to them is written."""
    out = tmp_path / "new.json"
    res = cli("run", "--engine", "sim", "--gpu-profile", files / "profile.json",
              "--num-requests", "3", "--output", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["summary"]["completed"] == 3
