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


# ---- 3. percentiles a result did not store are computed where they can be --------------------

ITL_P99_NOT_GATED = ("cbbench: warning: itl_ms.p99 is not gated: {path} did not store it (its "
                     "run's --percentiles: {ran}) and keeps no per-token ITL (run with "
                     "--save-detailed) to compute it from\n")


@pytest.fixture(scope="module")
def other_percentiles(tmp_path_factory) -> dict[str, str]:
    """The base run again (the same requests, the same simulated figures) storing other
    percentiles: 50,99.9 and 50,99 (no ITL p99 either way without --save-detailed), and 50,99.9
    with --save-detailed."""
    d = tmp_path_factory.mktemp("pct")
    return {
        "50,99.9": _run(d, "pct.json", "--percentiles", "50,99.9"),
        "50,99": _run(d, "pct99.json", "--percentiles", "50,99"),
        "detailed": _run(d, "detailed.json", "--percentiles", "50,99.9", "--save-detailed"),
    }


def test_percentiles_a_result_did_not_store_are_computed_from_its_requests(base,
                                                                           other_percentiles):
    """The same run stored at --percentiles 50,99.9 has no ttft_ms.p99 in its file, but its 40
    requests' TTFTs give it, equal to the base's own: every default metric held. ITL p99 needs
    the per-token lists it did not keep: that one metric is left out with one warning line (it
    was exit 2, `pct.json has no value for metric 'ttft_ms.p99'`)."""
    path, result = base
    pct = other_percentiles["50,99.9"]
    r = invoke("gate", pct, "--baseline", path)
    assert r.exit_code == 0, r.output
    assert r.stderr == ITL_P99_NOT_GATED.format(path=pct, ran="50,99.9")
    assert r.stdout.splitlines()[-1] == "gate: passed: 8 metrics held, 0 improved; exact comparison"
    p99 = f"{result['summary']['ttft_ms']['p99']:,.2f}"
    assert _row(r.stdout, "ttft_ms.p99")[2].split() == [p99, p99, "+0.0%", "10%", "ok"]
    assert "itl_ms.p99" not in r.stdout  # neither in the table nor among the defaults listed


def test_gate_percentiles_50_99_on_a_run_without_itl_p99(base, other_percentiles):
    """--percentiles 50,99 over the 50,99.9 run: ttft/tpot/e2el p99 from its requests, ITL p99
    left out with its warning (it was exit 2, `no value for metric 'itl_ms.p99'`)."""
    path, _ = base
    pct = other_percentiles["50,99.9"]
    r = invoke("gate", pct, "--baseline", path, "--percentiles", "50,99")
    assert r.exit_code == 0, r.output
    assert r.stderr == ITL_P99_NOT_GATED.format(path=pct, ran="50,99.9")
    assert r.stdout.splitlines()[-1] == ("gate: passed: 10 metrics held, 0 improved; "
                                         "exact comparison")


def test_an_itl_percentile_named_explicitly_is_still_an_error(base, other_percentiles):
    path, _ = base
    pct = other_percentiles["50,99.9"]
    r = invoke("gate", pct, "--baseline", path, "--max-regression", "itl_ms.p99=10%")
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"cbbench: error: {pct} has no value for metric 'itl_ms.p99': it did "
                        "not store it (its run's --percentiles: 50,99.9) and keeps no per-token "
                        "ITL (run with --save-detailed) to compute it from\n")


def test_itl_percentiles_come_from_saved_per_token_lists(base, other_percentiles):
    """With --save-detailed the ITL p99 is computed too, equal to the base's stored one."""
    path, result = base
    r = invoke("gate", other_percentiles["detailed"], "--baseline", path)
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    assert r.stdout.splitlines()[-1] == "gate: passed: 9 metrics held, 0 improved; exact comparison"
    p99 = f"{result['summary']['itl_ms']['p99']:,.2f}"
    assert _row(r.stdout, "itl_ms.p99")[2].split() == [p99, p99, "+0.0%", "10%", "ok"]


def test_a_run_that_stored_every_percentile_read_needs_none_computed(base, other_percentiles):
    """50,99 stored every p50 and p99 itself, ITL's too (99 was asked): nothing to warn."""
    path, _ = base
    r = invoke("gate", other_percentiles["50,99"], "--baseline", path)
    assert r.exit_code == 0 and r.stderr == "", r.output


def test_a_summary_only_file_with_other_percentiles_leaves_them_out(tmp_path, base):
    """--summary-only at --percentiles 50,99.9: no requests to compute any p99 from; the
    default p99 thresholds are left out, one warning line each, and the p50s still gate."""
    path, _ = base
    lean = _run(tmp_path, "lean.json", "--percentiles", "50,99.9", "--summary-only")
    r = invoke("gate", lean, "--baseline", path)
    assert r.exit_code == 0, r.output
    skipped = [ln.split()[2] for ln in r.stderr.splitlines()]
    assert skipped == ["ttft_ms.p99", "tpot_ms.p99", "itl_ms.p99", "e2el_ms.p99"]
    assert (f"cbbench: warning: ttft_ms.p99 is not gated: {lean} did not store it (its run's "
            "--percentiles: 50,99.9) and keeps no per-request records (a --summary-only file) "
            "to compute it from") in r.stderr.splitlines()
    assert r.stdout.splitlines()[-1] == "gate: passed: 5 metrics held, 0 improved; exact comparison"


def test_compare_shows_the_percentiles_it_can_compute(base, other_percentiles):
    """compare base pct: TTFT, TPOT and E2EL p99 from pct's requests, equal to the base's (it
    showed '-' for every p99 row); ITL p99 cannot be computed and stays '-'."""
    path, _ = base
    r = invoke("compare", path, other_percentiles["50,99.9"])
    assert r.exit_code == 0, r.output
    rows = {ln[:30].strip(): ln[30:].split() for ln in r.stdout.splitlines() if " p99 (ms)" in ln}
    for label in ("TTFT p99 (ms)", "TPOT p99 (ms)", "E2EL p99 (ms)"):
        first, second, ratio = rows[label]
        assert second == first and ratio == "(1.00×)", rows
    assert rows["ITL p99 (ms)"][1] == "-"


def test_compare_keeps_a_percentile_row_no_result_can_fill(base, other_percentiles):
    """compare --percentiles 99.9 over two runs without --save-detailed (results/speculative.md's
    two sim runs, say): ITL p99.9 is in neither file and cannot be computed for either, so its
    row reads '-' in both columns, as docs/metrics.md says; the row was dropped without a word,
    so the table read as if ITL p99.9 had not been asked for."""
    path, _ = base
    r = invoke("compare", path, other_percentiles["50,99"], "--percentiles", "99.9")
    assert r.exit_code == 0, r.output
    rows = {ln[:30].strip(): ln[30:].split() for ln in r.stdout.splitlines() if " p99.9 (ms)" in ln}
    assert list(rows) == ["TTFT p99.9 (ms)", "TPOT p99.9 (ms)", "ITL p99.9 (ms)",
                          "E2EL p99.9 (ms)"], r.stdout
    assert rows["ITL p99.9 (ms)"] == ["-", "-"]
