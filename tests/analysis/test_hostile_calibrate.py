"""calibrate reads what it fits (issue 25, rule 7).

Seven kinds of tampered iteration records (Infinity, text, a missing field, 1e300, 10^30, a
record that is a number, an unknown GPU) were tracebacks; negative token counts were fitted
silently; 200 copies of one iteration reported four parameters "fitted" with zero error. Each
record is now checked field by field (one line naming the file, the iteration and the field,
exit 2), and a parameter is identified only when the data vary in what it multiplies.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from helpers import run_spec
from typer.testing import CliRunner

from cbbench.analysis.calibration import calibrate
from cbbench.bench.runner import execute_run
from cbbench.cli.app import app
from cbbench.engine.args import EngineArgs
from cbbench.engine.model_config import MODEL_PRESETS
from cbbench.engine.sim.cost_model import BatchShape, CostModel, DeviceRates
from cbbench.schema.base import to_dict

RATES = DeviceRates(memory_bandwidth=20e9, flop_rate=100e9, iteration_overhead_s=2e-4,
                    row_overhead_s=2e-5)


@pytest.fixture(scope="module")
def real() -> dict:
    """A simulated run's iterations re-timed as a CPU with RATES would run them (noise 5%):
    what calibrate reads from a real run."""
    spec = run_spec(workload="sharegpt", num_requests=40, request_rate=30.0,
                   engine=EngineArgs(engine="sim", model="small", dtype="fp32",
                                     max_num_seqs=32, max_num_batched_tokens=1024))
    res = to_dict(execute_run(spec))  # the file's dict, to tamper with
    cm = CostModel(MODEL_PRESETS["small"], "fp32", rates=RATES)
    rng = np.random.default_rng(0)
    for it in res["iterations"]:
        shape = BatchShape(it["num_prefill_tokens"] + it["num_decode_tokens"], it["num_logits"],
                           it["attn_key_pairs"], it["attn_keys_read"],
                           it["num_prefill_reqs"] + it["num_decode_reqs"], it["num_prefill_reqs"],
                           it["attn_decode_keys"])
        it["duration_s"] = cm.cost(shape).time_s * float(np.exp(rng.normal(0, 0.05)))
    res["config"].update(engine="torch", device="cpu", device_name="cpu", gpu=None,
                         gpu_spec=None)
    return res


def _copy(real: dict) -> dict:
    """A copy of the run to tamper with: the top level, the config and every iteration record
    (flat dicts of numbers) copied, which is all the tests change; the request records, which
    nothing changes, shared. copy.deepcopy walked every value of the run's ~3,900 iterations
    and 40 requests for each of 14 copies (0.15 CPU-s a copy)."""
    return {**real, "config": dict(real["config"]),
            "iterations": [dict(it) for it in real["iterations"]]}  # fmt: skip


def _tampered(real: dict, k: int, field: str | None, value) -> dict:
    res = _copy(real)
    if field is None:
        res["iterations"][k] = value
    elif value is KeyError:
        del res["iterations"][k][field]
    else:
        res["iterations"][k][field] = value
    return res


TAMPERED = {
    "infinity": ("duration_s", float("inf"), "duration_s inf"),
    # The typed result schema refuses these two first, naming the field by its path.
    "text": ("num_decode_tokens", "12", "iterations.3.num_decode_tokens: Input should be a valid integer"),
    "missing": ("attn_key_pairs", KeyError, "has no 'attn_key_pairs'"),
    "1e300": ("attn_keys_read", 1e300, "attn_keys_read 1e+300"),
    "10^30": ("num_prefill_tokens", 10**30, "num_prefill_tokens 1000000000000000000000000000000"),
    "a-number": (None, 7, "iterations.3: Input should be a valid dictionary"),
    # The schema types every field the fit reads (a count is a non-negative integer).
    "negative": ("num_decode_tokens", -5,
                 "iterations.3.num_decode_tokens: Input should be greater than or equal to 0"),
    # beyond the list: a bool where a count goes (true == 1 in Python), NaN
    "bool": ("num_logits", True, "iterations.3.num_logits: Input should be a valid integer"),
    "nan": ("duration_s", float("nan"), "duration_s nan"),
}


def _one_line(tmp_path, result: dict, text: str) -> None:
    src = tmp_path / "R.json"
    src.write_text(json.dumps(result))  # Infinity / NaN as Python's json writes them
    out = tmp_path / "P.json"
    res = CliRunner().invoke(app, ["calibrate", str(src), "--out", str(out)])
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), res.stderr
    # calibrate's own check names "iteration 3"; the typed schema, which reads first, names
    # the field's path ("iterations.3..."): either way the file and the record are named.
    assert (f"{src}: iteration 3" in lines[0] or f"{src}: not a valid cbbench result: iterations.3"
            in lines[0] or "config.gpu" in lines[0]), lines[0]
    assert text in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_record_is_one_line_naming_the_field(real, tmp_path, case):
    field, value, text = TAMPERED[case]
    _one_line(tmp_path, _tampered(real, 3, field, value), text)


def test_the_python_api_reads_each_record_through_the_schema(real):
    """calibrate() on results in memory (no file, so no file schema read first): each record
    still goes through the schema's Iteration model, then the fit's ranges."""
    from cbbench.errors import UsageError

    with pytest.raises(UsageError, match="mem.json: iteration 3: not a valid iteration "
                       "record: num_logits: Input should be a valid integer"):
        calibrate([("mem.json", _tampered(real, 3, "num_logits", "7"))])
    with pytest.raises(UsageError, match="mem.json: iteration 3 has duration_s inf"):
        calibrate([("mem.json", _tampered(real, 3, "duration_s", float("inf")))])


def test_an_unknown_gpu_is_one_line(real, tmp_path):
    res = _copy(real)
    res["config"].update(device="cuda", device_name="NVIDIA X9000", gpu="x9000")
    _one_line(tmp_path, res, "unknown GPU 'x9000'")


def _copies(real: dict) -> dict:
    one = _copy(real)  # its iterations replaced below
    decode = next(it for it in real["iterations"] if it["num_prefill_tokens"] == 0
                  and it["num_decode_tokens"] > 2)
    one["iterations"] = [dict(decode) for _ in range(200)]
    return one


@pytest.mark.parametrize("device", ["cpu", "h100"])
def test_copies_of_one_iteration_fit_at_most_one_scale_and_a_profile_run_accepts(
        real, tmp_path, device):
    """200 copies of one decode step (issue 37 rule 8): one point shows one sum. Four terms
    were "fitted" with zero error; then none was, with host_factor "fitted" (0% error), 100%
    residuals and a profile that `run --gpu-profile` refused (it predicted 0 s). Now at most
    one scale is fitted, the host factor is not, the profile says which rate it determined,
    and the simulator runs on it."""
    one = _copies(real)
    if device != "cpu":
        one["config"].update(device="cuda", device_name="NVIDIA H100 80GB HBM3", gpu="h100")
    path = tmp_path / "one.json"
    path.write_text(json.dumps(one))
    out = tmp_path / "profile.json"
    r = CliRunner().invoke(app, ["calibrate", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    profile = json.loads(out.read_text())
    fitted = [k for k, p in profile["params"].items() if p["status"] == "fitted"]
    assert len(fitted) <= 1, fitted
    assert "host_factor" not in fitted
    assert profile["params"]["host_factor"]["used"] == 1.0
    assert profile["distinct_shapes"] == 1
    assert "determined by the data:" in r.output
    # The one time is predicted (within the residuals the profile reports), not 100% off.
    assert profile["residuals"]["decode"]["median"] < 0.5
    sim = tmp_path / "sim.json"
    r = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu-profile", str(out),
                                 "--model", "small", "--dtype", "fp32", "--num-requests", "4",
                                 "--quiet", "--output", str(sim)])
    assert r.exit_code == 0, r.output
    assert json.loads(sim.read_text())["summary"]["completed"] == 4


def test_varied_iterations_are_still_fitted(real):
    """The same check on the run itself: the rates it was timed with are found."""
    profile = calibrate([("real.json", real)])
    p = profile["params"]
    assert p["memory_bandwidth"]["status"] == "fitted"
    assert p["memory_bandwidth"]["value"] == pytest.approx(RATES.memory_bandwidth, rel=0.15)


def _bench(rows: list[dict]) -> dict:
    """A decode microbenchmark file (tests/gpu/bench_gpu.py decode) of the 'small' model."""
    from cbbench.engine.sim.gpu_specs import get_gpu_spec

    return {"args": {"cmd": "decode", "dtype": "fp32", "steps": 20},
            "gpu_spec": get_gpu_spec("h100").to_dict(),
            "env": {"device_name": "NVIDIA H100 80GB HBM3"},
            "model_config": dataclasses.asdict(MODEL_PRESETS["small"]), "rows": rows}


def _row(batch, ms, **kw) -> dict:
    return {"batch_size": batch, "context": 512, "step_ms": {"p50": ms}, "graphs": True,
            "fused": True, "attention_backend": "triton", "role": "main", **kw}


@pytest.mark.parametrize(("rows", "message"), [
    ([_row(1, float("nan"))], "step_ms.p50 must be a time > 0 ms"),
    ([_row(1, 5.0, batch_size=0)], "batch_size: expected an integer"),
    ([_row(1, 5.0, graphs=False)], "no decode rows run as the results were"),
    (["x"], "rows[0] is not an object"),
])
def test_a_bad_decode_microbenchmark_is_one_line(tmp_path, rows, message):
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(_bench(rows)))
    r = CliRunner().invoke(app, ["calibrate", str(path), "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error:") and message in lines[0]
    assert not (tmp_path / "p.json").exists()


def test_decode_rows_alone_write_a_profile_a_run_accepts(tmp_path):
    """Four microbenchmark rows and the spec's priors: a profile, its status per rate."""
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(_bench([_row(b, 1.0 + 0.01 * b) for b in (1, 16, 64, 256)])))
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["calibrate", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    profile = json.loads(out.read_text())
    assert profile["sources"][0]["iterations_used"] == 4
    fitted = [k for k, p in profile["params"].items() if p["status"] == "fitted"]
    assert len(fitted) <= 4, fitted  # four shapes show at most four scales
    r = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu-profile", str(out), "--model",
                                 "small", "--dtype", "fp32", "--num-requests", "3", "--quiet",
                                 "--output", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output


def test_a_gzip_result_that_is_not_gzip_is_one_line(tmp_path):
    path = tmp_path / "run.json.gz"
    path.write_text("{}")
    r = CliRunner().invoke(app, ["calibrate", str(path), "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "cannot read" in r.stderr and r.stderr.count("\n") == 1, r.output
