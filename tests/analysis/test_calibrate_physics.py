"""calibrate on a GPU stays inside the device's physics, and says what the data touched
(the seventh review, items 4-6).

The data are synthetic (tests/synthetic_gpu_run.py): a short simulated run's steps re-timed
by known rates and recorded as a torch run on an H100. Rates faster than the H100's datasheet
(5 TB/s where it has 3.35) make a trace no H100 can have recorded: the bounded fit stops at the
peak, and a host factor below 1 used to carry the profile past it, silently.
"""

from __future__ import annotations

import json

import pytest
from synthetic_gpu_run import retimed, sim_shapes
from typer.testing import CliRunner

from cbbench.analysis.calibration import calibrate
from cbbench.cli.app import app
from cbbench.engine.model_config import MODEL_PRESETS
from cbbench.engine.sim.cost_model import BatchShape, CostModel, DeviceRates
from cbbench.engine.sim.device_profile import load_profile
from cbbench.engine.sim.gpu_specs import get_gpu_spec

H100 = get_gpu_spec("h100")
LLAMA = MODEL_PRESETS["llama-3-8b"]
# Faster than any H100: 5 TB/s of HBM (its peak is 3.35), 900 TFLOP/s, no overhead.
FASTER_THAN_H100 = DeviceRates(memory_bandwidth=5e12, flop_rate=9e14)
# An H100-like device: inside the spec (84% of peak bandwidth, 61% of peak FLOP rate).
LIKE_H100 = DeviceRates(memory_bandwidth=2.8e12, flop_rate=6e14, iteration_overhead_s=3e-4,
                        row_overhead_s=2e-5, decode_attention_efficiency=0.6,
                        prefill_attention_efficiency=0.5)
BATCH1_DECODE_512 = BatchShape(1, 1, 513.0, 513.0, 1, 0, 513.0)


@pytest.fixture(scope="module")
def shapes() -> dict:
    return sim_shapes()


@pytest.fixture(scope="module")
def too_fast(shapes) -> dict:
    return calibrate([("fast.json", retimed(shapes, FASTER_THAN_H100, noise=0.01))])


def _floor_s(shape: BatchShape) -> float:
    """The H100's floor for the step by hand: its bytes at the peak bandwidth, its FLOPs at
    the peak FLOP rate, whichever is longer (a lower bound of the roofline's per-operator
    maximum)."""
    c = CostModel(LLAMA, "bf16").cost(shape)
    return max(c.bytes / H100.hbm_bandwidth, c.flops / H100.bf16_flops)


def test_a_trace_faster_than_the_gpu_gives_no_profile_faster_than_the_gpu(too_fast, tmp_path):
    """The reviewer's repro in small: 5 TB/s on an "H100" gave memory_bandwidth at bound,
    host_factor 0.695 "fitted", and a batch-1 decode predicted at 4.8 TB/s, under the H100's
    floor, with only residual warnings. Now the factor is held where every step is physical,
    and the profile says what was fitted and why it is not used."""
    hf = too_fast["params"]["host_factor"]
    assert hf["fitted_value"] < 0.75  # what the data gave: 3.35 / 5 or so
    assert hf["status"] == "at bound" and hf["value"] is None
    assert hf["used"] == too_fast["rates"]["host_factor"] >= 0.99
    warning = too_fast["warnings"][0]
    assert f"host_factor {hf['fitted_value']:.4g} was fitted" in warning
    assert "floor" in warning and "h100" in warning
    path = tmp_path / "p.json"
    path.write_text(json.dumps(too_fast))
    rates = load_profile(path).rates  # the load check passes
    t = CostModel(LLAMA, "bf16", rates=rates).cost(BATCH1_DECODE_512).time_s
    assert t >= _floor_s(BATCH1_DECODE_512) * (1 - 1e-6)


def test_the_cli_prints_the_physics_warning(shapes, tmp_path):
    path = tmp_path / "fast.json"
    path.write_text(json.dumps(retimed(shapes, FASTER_THAN_H100)))
    r = CliRunner().invoke(app, ["calibrate", str(path), "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    assert "warning: host_factor" in r.output and "floor" in r.output


def test_a_profile_faster_than_its_gpu_is_refused_at_load(shapes, tmp_path):
    """A profile whose host factor (hand-edited, or from a calibrate before this check) puts
    a step under the GPU's floor: one line, and the simulator does not run on it."""
    profile = calibrate([("h100.json", retimed(shapes, LIKE_H100, noise=0.01))])
    good = tmp_path / "good.json"
    good.write_text(json.dumps(profile))
    load_profile(good)
    profile["rates"]["host_factor"] = 0.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="faster than the h100's floor"):
        load_profile(bad)
    r = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu-profile", str(bad),
                                 "--num-requests", "2", "--quiet", "--output",
                                 str(tmp_path / "s.json")])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "floor" in lines[0], r.stderr


def test_a_host_factor_below_1_has_a_share_of_time():
    """median_share_of_time read 0 whenever the factor was below 1, as if it did nothing; a
    factor of 0.7 takes 43% off every step: the share is 1 - 1/factor, signed."""
    import numpy as np

    # The CPU has no spec and no floor: a factor below 1 stays, and says how much it takes.
    shapes = sim_shapes(model="small", gpu="h100")
    slow = DeviceRates(memory_bandwidth=4e9, flop_rate=12e9, iteration_overhead_s=2e-3)
    run = retimed(shapes, slow, model="small", gpu="cpu", noise=0.02)
    rng = np.random.default_rng(1)
    for it in run["iterations"]:  # a third of the steps 3x faster: the mean under the typical
        if rng.random() < 1 / 3:
            it["duration_s"] /= 3.0
    hf = calibrate([("cpu.json", run)])["params"]["host_factor"]
    assert hf["used"] < 1
    assert hf["median_share_of_time"] == pytest.approx(1 - 1 / hf["used"])


def test_a_bound_the_data_never_touched_is_not_at_bound(shapes):
    """A decode-only trace has no prefill row: prefill attention's prior (1) is its bound, and
    it read "at bound", "the data ask for more than the device's physics allow", at data share
    0. It is the prior, said in those words; a bound the data did push to stays at bound."""
    decode_only = retimed(shapes, LIKE_H100, noise=0.01,
                          keep=lambda it: it["num_prefill_tokens"] == 0)
    params = calibrate([("decode.json", decode_only)])["params"]
    pa = params["prefill_attention_efficiency"]
    assert pa["data_share"] == pytest.approx(0.0, abs=1e-6)
    assert pa["status"] == "prior", pa
    assert "ask for more" not in pa["note"] and "no iteration in the data shows it" in pa["note"]
    assert params["prefill_overhead_s"]["status"] == "prior"


def test_a_bound_the_data_pushed_to_is_at_bound(too_fast):
    """The bandwidth's prior is 80% of peak: the 5 TB/s trace moved it to the peak."""
    bw = too_fast["params"]["memory_bandwidth"]
    assert bw["status"] == "at bound"
    assert "ask for more" in bw["note"]
