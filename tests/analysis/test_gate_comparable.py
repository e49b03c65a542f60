"""What `cbbench gate` and `cbbench compare` hold comparable (the sixth review): two results
that served different loads are refused, not judged; results built from the same simulated run
with their verdicts known by hand."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cbbench.analysis.result import write_result
from cbbench.cli.app import app

runner = CliRunner()
SIM = ["run", "--engine", "sim", "--num-requests", "40", "--quiet"]


def invoke(*args: str):
    return runner.invoke(app, list(args))


def _run(tmp_path, name: str, *flags: str) -> str:
    path = tmp_path / name
    r = invoke(*SIM, *flags, "--output", str(path))
    assert path.exists(), r.output
    return str(path)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[str, dict]:
    """40 ShareGPT requests on the simulator, all at t=0: the path and its JSON."""
    path = _run(tmp_path_factory.mktemp("base"), "base.json")
    with open(path) as f:
        return path, json.load(f)


def _save(tmp_path, name: str, result: dict) -> str:
    path = tmp_path / name
    write_result(path, result)
    return str(path)


def _different_load(path: str, baseline: str, key: str, new: object, old: object) -> str:
    return (f"cbbench: error: {path} ran a different load from {baseline}: {key} {new!r} vs "
            f"{old!r} (pass --allow-different-workload to compare anyway)\n")


# ---- 1. every config key that sets the offered load is compared ------------------------------


def test_two_ramps_are_two_loads(tmp_path):
    """Two ramps over the same 40 requests: 1->40 req/s in 2 s sends them all within ~2 s,
    1->2 req/s in 20 s over ~20 s. The slower ramp's throughput is lower because it was offered
    less, not because anything regressed: exit 2, as for two --request-rate values (it was
    exit 1, `output_throughput, request_throughput regressed`: request_rate is null under a
    ramp, and the ramp was not compared)."""
    fast = _run(tmp_path, "ramp.json", "--ramp", "1:40:2")
    slow = _run(tmp_path, "ramp2.json", "--ramp", "1:2:20")
    r = invoke("gate", slow, "--baseline", fast)
    assert r.exit_code == 2, r.output
    assert r.stderr == _different_load(
        slow, fast, "ramp", {"start_rate": 1.0, "end_rate": 2.0, "seconds": 20.0},
        {"start_rate": 1.0, "end_rate": 40.0, "seconds": 2.0})
    assert invoke("gate", slow, "--baseline", fast,
                  "--allow-different-workload").exit_code == 1  # then judged, and it is slower
    out = invoke("compare", fast, slow).output
    assert "note: the results served different loads (ramp differ): not like for like" in out


# A value each key takes in a real run, against the base run's (none of them set).
LOAD_KEYS = [
    ("ramp", {"start_rate": 1.0, "end_rate": 40.0, "seconds": 2.0}),
    ("max_concurrency", 8),
    ("images", {"images_per_request": 2, "image_size": ["512x512"], "image_format": "png"}),
    ("batch_size", 16),
]


@pytest.mark.parametrize("key, value", LOAD_KEYS, ids=[k for k, _ in LOAD_KEYS])
def test_a_different_load_key_is_refused(tmp_path, base, key, value):
    """The same figures under another ramp, --max-concurrency cap (a closed loop's load is its
    cap), random-mm images per request or embeddings inputs per request: gate passed them
    (identical numbers), so it would have judged any two such runs as one load."""
    path, result = base
    other = copy.deepcopy(result)
    other["config"][key] = value
    new = _save(tmp_path, "new.json", other)
    r = invoke("gate", new, "--baseline", path)
    assert r.exit_code == 2, r.output
    assert r.stderr == _different_load(new, path, key, value, None)
    assert invoke("gate", new, "--baseline", path, "--allow-different-workload").exit_code == 0
    note = invoke("compare", path, new).output
    assert f"note: the results served different loads ({key} differ)" in note
