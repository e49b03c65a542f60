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


# ---- 2. a new run in which every request failed is a regression, not bad input ---------------

FAILED_ALL = ("gate: FAILED: 9 of 9 metrics regressed (output_throughput, request_throughput, "
              "ttft_ms.p50, ttft_ms.p99, tpot_ms.p50, tpot_ms.p99, itl_ms.p99, e2el_ms.p99, "
              "failed); exact comparison")


@pytest.fixture(scope="module")
def all_failed(tmp_path_factory) -> str:
    """The base run's 40 requests against a 20-token context: every one is rejected (0 of 40
    completed, throughput 0, no latency at all)."""
    path = _run(tmp_path_factory.mktemp("allfail"), "allfail.json", "--max-model-len", "20")
    with open(path) as f:
        s = json.load(f)["summary"]
    assert (s["completed"], s["failed"], s["ttft_ms"]["p50"]) == (0, 40, None)
    return path


def _row(stdout: str, metric: str) -> list[str]:
    return next(ln.split(None, 2) for ln in stdout.splitlines() if ln.startswith(metric + " "))


def test_a_new_run_with_no_completed_request_regresses(base, all_failed):
    """0 -> 40 failed against a limit of 0, throughput 12.46 -> 0 req/s, and no latency: exit 1
    with every default metric regressed, the latencies shown as the run's lack of them (it was
    exit 2, `allfail.json has no value for metric 'ttft_ms.p50'`, no table, the failures never
    reported)."""
    path, _ = base
    r = invoke("gate", all_failed, "--baseline", path)
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    assert lines[-1] == FAILED_ALL
    assert _row(r.stdout, "failed")[2].split() == ["0", "40", "+40", "0", "REGRESSED"]
    assert _row(r.stdout, "output_throughput")[2].split()[1:] == ["0", "-100.0%", "5%",
                                                                    "REGRESSED"]
    for metric in ("ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p99", "itl_ms.p99", "e2el_ms.p99"):
        cells = _row(r.stdout, metric)[2]
        assert cells.split()[1:] == ["-", "no", "completed", "request", "10%", "REGRESSED"]
    # A latency gated alone fails too: a run that served nothing has not held its latency.
    r = invoke("gate", all_failed, "--baseline", path, "--no-defaults",
               "--max-regression", "ttft_ms.p99=10%")
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines()[-1] == ("gate: FAILED: 1 of 1 metrics regressed (ttft_ms.p99); "
                                         "exact comparison")


def test_one_of_several_new_runs_with_no_completed_request_regresses(base, all_failed):
    """Two new runs as good as the baseline and one that served nothing: no mean or interval
    to draw, and not noise either; regressed, saying how many runs completed nothing."""
    path, _ = base
    r = invoke("gate", "--baseline", path, path, path, "--new", path, path, all_failed,
               "--no-defaults", "--max-regression", "e2el_ms.p99=10%")
    assert r.exit_code == 1, r.output
    cells = _row(r.stdout, "e2el_ms.p99")[2]
    assert cells.split()[:4] == ["3,176.71", "(mean", "of", "3)"]
    assert cells.split()[4:] == ["-", "1", "of", "3", "runs", "completed", "no", "request",
                                 "10%", "REGRESSED"]


def test_a_baseline_with_no_completed_request_cannot_be_held_to(base, all_failed):
    """The other way round there is nothing to compare the new latencies with: exit 2, one
    line saying why. A metric the failed baseline has (failed) still compares."""
    path, _ = base
    r = invoke("gate", path, "--baseline", all_failed)
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"cbbench: error: {all_failed} has no value for metric 'ttft_ms.p50': "
                        "none of its requests completed, so it has no latency to hold the new "
                        "result to (gate a baseline that served its requests)\n")
    r = invoke("gate", path, "--baseline", all_failed, "--no-defaults",
               "--max-regression", "failed=0")
    assert r.exit_code == 0 and "improved" in r.stdout, r.output
