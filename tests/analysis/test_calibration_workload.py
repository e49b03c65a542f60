"""The built-in ``calibration`` workload (issue 38): one short run that excites every term of
the roofline, so `cbbench calibrate` fits what a ShareGPT run at batch 32 leaves to the spec.

Its iterations (the simulator's, on an H100 with llama-3-8b at --max-num-seqs 128) are re-timed
as a GPU with known rates far from the spec's priors would run them (3% noise), then fitted."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cbbench.analysis.calibration import calibrate
from cbbench.cli.app import app
from cbbench.engine.model_config import MODEL_PRESETS
from cbbench.engine.sim.cost_model import BatchShape, CostModel, DeviceRates
from cbbench.workloads.calibration import PROMPT_LENS, WAVE_MAX, calibration_rows

# Far from the priors (80% of 3.35 TB/s, 60% of 989 TFLOP/s, 300 µs, efficiencies 1).
TRUE = DeviceRates(memory_bandwidth=1.8e12, flop_rate=400e12, iteration_overhead_s=1.2e-3,
                   row_overhead_s=10e-6, prefill_overhead_s=100e-6,
                   decode_attention_efficiency=0.7, prefill_attention_efficiency=0.5)
NOISE = 0.03
MAX_NUM_SEQS = 128
# What each fitted rate must come within (relative). The overheads are checked through the
# step times they add up to: each is a few percent of a step, and the fit trades them.
TOLERANCE = {"memory_bandwidth": 0.1, "flop_rate": 0.1, "decode_attention_efficiency": 0.1,
             "prefill_attention_efficiency": 0.1}


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("cal") / "run.json"
    r = CliRunner().invoke(app, [
        "run", "--workload", "calibration", "--arrival", "trace",
        "--num-requests", str(len(calibration_rows())), "--engine", "sim", "--gpu", "h100",
        "--model", "llama-3-8b", "--max-num-seqs", str(MAX_NUM_SEQS), "--quiet",
        "--output", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def test_the_workload_spans_every_regime(sim_run):
    its = sim_run["iterations"]
    batch = np.array([it["num_decode_reqs"] for it in its])
    prefill = np.array([it["num_prefill_tokens"] for it in its])
    ctx = np.array([it["attn_decode_keys"] / max(it["num_decode_reqs"], 1) for it in its])
    assert batch.min() == 0 and (batch == 1).any() and batch.max() >= WAVE_MAX * 3 // 4
    # Decode at every power-of-two band of batch size from 1 to 64.
    for lo in (1, 2, 4, 8, 16, 32, 64):
        assert ((batch >= lo) & (batch < 2 * lo)).any(), lo
    assert ctx[batch > 0].min() <= 2 * PROMPT_LENS[0] and ctx[batch > 0].max() >= 7000
    assert len(np.unique(prefill[prefill > 0])) >= 20  # chunks of many sizes
    assert ((prefill > 0) & (batch > 0)).sum() >= 50  # mixed steps


def _retimed(run: dict) -> dict:
    cost = CostModel(MODEL_PRESETS["llama-3-8b"], "bf16", rates=TRUE)
    rng = np.random.default_rng(0)
    for it in run["iterations"]:
        shape = BatchShape(it["num_prefill_tokens"] + it["num_decode_tokens"], it["num_logits"],
                           it["attn_key_pairs"], it["attn_keys_read"],
                           it["num_prefill_reqs"] + it["num_decode_reqs"],
                           it["num_prefill_reqs"], it["attn_decode_keys"])
        it["duration_s"] = cost.cost(shape).time_s * float(np.exp(rng.normal(0, NOISE)))
    run["config"].update(engine="torch", device="cuda", device_name="NVIDIA H100 80GB HBM3",
                         gpu="h100")
    return run


def test_calibrate_recovers_every_rate_from_one_calibration_run(sim_run):
    """Every term the fit calls fitted comes within its tolerance of the truth; a pair it
    calls confounded (the weight read and the fixed overhead: both constant per step) is
    named as such, and their sum is right: every kind of step is predicted within 5%."""
    profile = calibrate([("calibration.json", _retimed(sim_run))])
    params = profile["params"]
    for name, tol in TOLERANCE.items():
        got, want = profile["rates"][name], getattr(TRUE, name)
        if params[name]["status"] == "fitted":
            assert got == pytest.approx(want, rel=tol), (name, got, want, params[name])
        else:
            assert params[name]["status"] in ("confounded", "prior"), params[name]
            assert params[name].get("confounded_with"), params[name]
    # The attention efficiencies, which a ShareGPT run leaves to the prior, are fitted here.
    for name in ("decode_attention_efficiency", "prefill_attention_efficiency"):
        assert params[name]["status"] == "fitted", params[name]
    fitted = DeviceRates(**profile["rates"])
    model = MODEL_PRESETS["llama-3-8b"]
    truth, got = CostModel(model, "bf16", rates=TRUE), CostModel(model, "bf16", rates=fitted)
    for b, c, n in ((1, 1024, 0), (1, 8000, 0), (128, 2048, 0), (1, 0, 2048)):
        shape = (BatchShape(b, b, b * (c + 1.0), b * (c + 1.0), b, 0, b * (c + 1.0)) if not n
                 else BatchShape(n, 1, n * (n + 1) / 2, n, 1, 1, 0.0))
        assert got.cost(shape).time_s == pytest.approx(truth.cost(shape).time_s, rel=0.05), (
            b, c, n)
