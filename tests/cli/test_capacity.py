"""`cbbench capacity`: SLO parsing, the bracket-and-bisect search, and a real search on the
simulated H200 whose answer holds up in independent runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import run_spec
from typer.testing import CliRunner

from cbbench.analysis.summary.slo import DEFAULT_ATTAINMENT, parse_attainment_slo, request_meets
from cbbench.bench.capacity import ABOVE_MAX, BELOW_MIN, FOUND, INTERRUPTED, Probe, search
from cbbench.bench.probe import ProbePoint, ProbeSizing, probe_spec
from cbbench.bench.runner import execute_run
from cbbench.cli.app import app as cli_app
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError

# The real app: its command classes hold the one bad-input boundary (exit 2).
app = cli_app


runner = CliRunner()

# ---- SLO parsing ----------------------------------------------------------------------------


def test_suffix_names_the_attainment():
    s = parse_attainment_slo("ttft_p99=1000,tpot_p99=50")
    assert s.limits_ms == {"ttft": 1000.0, "tpot": 50.0}
    assert s.attainment == pytest.approx(0.99) and s.source == "suffix"
    assert parse_attainment_slo("e2el_p99.9=8000").attainment == pytest.approx(0.999)
    # Keys without a suffix follow the one that has it.
    assert parse_attainment_slo("ttft_p90=500,tpot=40").attainment == pytest.approx(0.90)


def test_attainment_option_overrides_and_default():
    s = parse_attainment_slo("ttft_p99=1000", attainment=0.95)
    assert s.attainment == 0.95 and s.source == "--attainment"
    d = parse_attainment_slo("ttft=1000")
    assert d.attainment == DEFAULT_ATTAINMENT and d.source == "default"
    assert parse_attainment_slo(None) is None


@pytest.mark.parametrize(
    ("text", "attainment", "message"),
    [
        ("ttft_p99=1000,tpot_p90=50", None, "different percentiles"),
        ("itl_p99=50", None, "invalid SLO"),
        ("ttft_p99", None, "invalid SLO"),
        ("ttft_p99=fast", None, "milliseconds expected"),
        ("ttft_p99=-5", None, "must be > 0"),
        ("ttft_p99=inf", None, "must be > 0"),
        ("ttft_p0=100", None, "percentile"),
        ("ttft_p101=100", None, "percentile"),
        ("ttft=1,ttft_p99=2", None, "given twice"),
        ("ttft_p99=1000", 1.5, "--attainment"),
        ("ttft_p99=1000", 0.0, "--attainment"),
    ],
)
def test_slo_parse_errors(text, attainment, message):
    with pytest.raises(UsageError, match=message):
        parse_attainment_slo(text, attainment)


def test_cli_slo_errors_exit_2():
    r = runner.invoke(app, ["capacity", "--engine", "sim", "--slo", "ttft_p99=1000,tpot_p90=50"])
    assert r.exit_code == 2 and "different percentiles" in r.output
    r = runner.invoke(app, ["capacity", "--engine", "sim", "--slo", "latency=5"])
    assert r.exit_code == 2 and "invalid SLO" in r.output
    r = runner.invoke(
        app, ["capacity", "--engine", "sim", "--slo", "ttft=5", "--precision", "0"]
    )
    assert r.exit_code == 2 and "--precision" in r.output


def test_a_precision_no_rounded_rate_reaches_is_refused(tmp_path):
    """--precision 0.0001 ran 15 probes and said "found", bracket 77.28-77.29 (+0.013%): the
    rates are rounded to 4 significant digits, so the bisection stopped short of what was
    asked and did not say so. 0.001 is reachable at every rate."""
    r = runner.invoke(app, ["capacity", "--engine", "sim", "--slo", "ttft=5",
                            "--num-requests", "20", "--min-duration", "0",
                            "--out", str(tmp_path / "c.json"), "--precision", "0.0001"])
    assert r.exit_code == 2 and "--precision must be at least 0.001" in r.output
    found = search(_fake(77.2834), 30.0, precision=0.001)
    assert (found.hi - found.lo) / found.lo <= 0.001 and found.lo <= 77.2834 < found.hi


def test_request_meets_every_limit():
    limits = {"ttft": 100.0, "tpot": 10.0}
    ok = {"error": None, "ttft_ms": 90.0, "tpot_ms": 9.0, "e2el_ms": 500.0}
    assert request_meets(ok, limits)
    assert not request_meets({**ok, "tpot_ms": 11.0}, limits)
    assert request_meets({**ok, "tpot_ms": None}, limits)  # one output token: no TPOT
    assert not request_meets({**ok, "error": "rejected", "ttft_ms": None}, limits)


# ---- the search, on a fake target -----------------------------------------------------------


def _fake(threshold: float):
    """A target that meets the SLO below `threshold` req/s."""

    def probe(rate: float, phase: str) -> Probe:
        ok = rate <= threshold
        point = ProbePoint(rate, 100, 100, 0, rate, rate * 100, *([1.0] * 7), None,
                           1.0 if ok else 0.5, True, "", "yes")
        return Probe(0, phase, point, point.slo_attainment, ok, ok)

    return probe


@pytest.mark.parametrize("start", [1.0, 7.0, 40.0])
def test_search_brackets_then_bisects_to_precision(start):
    found = search(_fake(10.0), start, precision=0.05)
    assert found.status == FOUND
    assert found.lo <= 10.0 < found.hi
    assert (found.hi - found.lo) / found.lo <= 0.05
    assert found.capacity == found.lo
    phases = [p.phase for p in found.probes]
    assert phases[0] == "bracket" and phases[-1] == "bisect"
    first_bisect = phases.index("bisect")
    assert set(phases[:first_bisect]) == {"bracket"} and set(phases[first_bisect:]) == {"bisect"}


def test_search_reports_when_no_bracket_exists():
    assert search(_fake(1e9), 1.0).status == ABOVE_MAX
    below = search(_fake(0.0), 1.0)
    assert below.status == BELOW_MIN and below.capacity is None


SHORT_SEARCH = ["--engine", "sim", "--workload", "sharegpt", "--num-requests", "40",
                "--min-duration", "0", "--slo", "ttft_p90=500,tpot_p90=30"]


@pytest.fixture(scope="module")
def short_search(tmp_path_factory):
    """40 requests a probe, fresh prompts each: a search of a couple of seconds."""
    out = tmp_path_factory.mktemp("short") / "capacity.json"
    r = runner.invoke(app, ["capacity", *SHORT_SEARCH, "--out", str(out),
                            "--runs-dir", str(out.parent / "probes")])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), r.stdout


def test_a_probe_too_short_to_judge_bounds_no_capacity(short_search):
    """40 requests a probe and no --min-duration on the simulated H200: every probe above ~19
    req/s met the SLO (100%) and was "not steady" only as its arrivals ended during the
    ramp-up, and the search said "capacity: 18.59 req/s (passes; 19.41 req/s fails)", status
    found, where 1,000-request probes pass up to ~77 req/s. The answer is a lower bound that
    names the probe it could not judge."""
    doc, stdout = short_search
    assert doc["status"] == "too_short", stdout
    short = [p for p in doc["probes"] if p["too_short"]]
    assert short and all(p["meets_slo"] and not p["passed"] for p in short)
    lo = max(p["rate"] for p in doc["probes"] if p["passed"])
    assert doc["capacity"] == lo and doc["bracket"] == [lo, None] and doc["margin"] is None
    unjudged = min(p["rate"] for p in short if p["rate"] > lo)
    assert f"capacity: >= {lo:.4g} req/s (passes): {unjudged:.4g} req/s met the SLO" in stdout
    assert "too short to judge" in stdout and "fails: bracket" not in stdout


def test_a_probe_too_small_to_judge_is_no_pass(tmp_path):
    """15 requests a probe: too few for any steady-state test (steady "-"), and each counted
    as a pass, so the search doubled to "capacity: >= 1600 req/s (every probe passed up to
    the search's ceiling)" on a target that falls behind above ~77 req/s. A probe passes only
    in a steady state (the command's own help); a lower rate sends no more requests, so the
    search stops at once and says so."""
    out = tmp_path / "capacity.json"
    r = runner.invoke(app, ["capacity", *SHORT_SEARCH, "--num-requests", "15",
                            "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["status"] == "too_short", r.stdout
    assert r.exit_code == 1 and doc["capacity"] is None and doc["bracket"] == [None, None]
    [p] = doc["probes"]
    assert p["steady"] is None and p["meets_slo"] and not p["passed"] and p["too_short"]
    assert "capacity: not judged: " in r.stdout


def test_each_probe_names_the_seed_that_repeats_it(short_search, tmp_path):
    """Each probe draws its own prompts (its own seed); capacity.json did not say which, so
    the probe at the answer could not be run again without --runs-dir. `run --seed` at the
    probe's rate and size repeats its figures."""
    doc, _ = short_search
    p = next(p for p in doc["probes"] if p["rate"] == doc["capacity"])
    out = tmp_path / "run.json"
    r = runner.invoke(app, ["run", *SHORT_SEARCH[:4], "--slo", "ttft=500,tpot=30",
                            "--num-requests", str(p["num_requests"]),
                            "--request-rate", repr(p["rate"]), "--seed", str(p["seed"]),
                            "--output", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())["summary"]
    assert s["slo_attainment"] == p["attainment"]
    assert (s["ttft_ms"]["p99"], s["tpot_ms"]["p99"], s["e2el_ms"]["p99"]) == (
        p["ttft_p99_ms"], p["tpot_p99_ms"], p["e2el_p99_ms"])


def test_every_probe_names_its_file_in_runs_dir(short_search):
    """--runs-dir: probes 1.. named their result files in capacity.json, the saturation
    probe (probe 0, written there too) did not."""
    doc, _ = short_search
    for p in [doc["saturation_probe"], *doc["probes"]]:
        assert p["file"] and p["file"].endswith(f"-rate-{p['rate']}.json"), p["file"]
        run = json.loads(Path(p["file"]).read_text())
        assert run["summary"]["completed"] == p["completed"]


def test_a_true_failure_below_the_short_probe_still_brackets():
    """Only a too-short probe between the answer and every true failure makes it a bound."""

    def probe(rate: float, phase: str) -> Probe:
        ok, short = rate <= 10.0, rate > 40.0  # fails truly in (10, 40]
        point = ProbePoint(rate, 100, 100, 0, rate, rate * 100, *([1.0] * 7), None,
                           1.0 if ok or short else 0.5, ok, "", "yes")
        return Probe(0, phase, point, point.slo_attainment, ok or short, ok, too_short=short)

    found = search(probe, 80.0)
    assert found.status == FOUND and found.lo <= 10.0 < found.hi <= 40.0


def test_an_interrupted_search_brackets_only_with_judged_probes():
    """Stopped (Ctrl-C / SIGTERM) after a probe that met the SLO but was too short to judge:
    the saved bracket took that probe's rate as its failing end ([10, 20]), where no probe
    failed. Too short to judge is neither a pass nor a fail (as in the uninterrupted search)."""
    stopped = []

    def probe(rate: float, phase: str) -> Probe:
        ok, short = rate <= 10.0, rate > 10.0  # passes, then met the SLO too short to judge
        point = ProbePoint(rate, 100, 100, 0, rate, rate * 100, *([1.0] * 7), None,
                           1.0, ok, "", "yes")
        stopped.append(short)
        return Probe(0, phase, point, 1.0, True, ok, too_short=short)

    found = search(probe, 10.0, should_stop=lambda: any(stopped))
    assert found.status == INTERRUPTED and found.capacity == 10.0
    assert (found.lo, found.hi) == (10.0, None)


# ---- a real search on the simulated H200 ----------------------------------------------------

SLO = "ttft_p99=1000,tpot_p99=50"
# Few sequence slots: saturation near 9 req/s, so each probe is a couple of hundred requests.
SIM = ["--engine", "sim", "--model", "llama-3-8b", "--gpu", "h200", "--workload", "sharegpt",
       "--max-num-seqs", "8"]
SIZING = ["--num-requests", "200", "--min-duration", "20"]


@pytest.fixture(scope="module")
def capacity_doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("capacity") / "capacity.json"
    # --reuse-prompts: every probe draws the requests the independent runs below draw (seed
    # 0), so their verdicts are about the rate alone, not a different sample of ShareGPT.
    args = ["capacity", "--slo", SLO, *SIM, *SIZING, "--reuse-prompts", "--out", str(out)]
    with pytest.MonkeyPatch.context() as mp:  # the file's command is the process's argv
        mp.setattr(sys, "argv", ["cbbench", *args])
        r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "capacity:" in r.stdout
    return json.loads(out.read_text()), r.stdout


def test_capacity_finds_a_rate_within_precision(capacity_doc):
    doc, stdout = capacity_doc
    assert doc["status"] == FOUND
    lo, hi = doc["bracket"]
    assert doc["capacity"] == lo and (hi - lo) / lo <= 0.05
    assert doc["slo"]["attainment"] == pytest.approx(0.99)
    assert 0 < doc["capacity"] < doc["saturation_rate"] * 1.5
    # Every probe is reported, with its verdict and the figures behind it.
    assert len(doc["probes"]) >= 3
    for p in doc["probes"]:
        for key in ("rate", "attainment", "passed", "steady", "achieved_request_rate",
                    "ttft_p99_ms", "tpot_p99_ms", "e2el_p99_ms"):
            assert key in p
    assert any(p["passed"] for p in doc["probes"]) and not all(p["passed"] for p in doc["probes"])
    header = next(ln for ln in stdout.splitlines() if ln.startswith("#"))
    assert "attainment" in header and "TTFT p99" in header


def test_the_saturation_line_tells_its_rate_from_the_rows_achieved_rate(capacity_doc):
    """Issue 35: "saturation: ~72.37 req/s" sat beside probe 0's row reading 57.08 achieved,
    two definitions with nothing saying so. The line names both, and what each counts."""
    doc, stdout = capacity_doc
    line = next(ln for ln in stdout.splitlines() if ln.startswith("saturation (rate inf)"))
    achieved = doc["saturation_probe"]["achieved_request_rate"]
    assert f"~{doc['saturation_rate']:.4g} req/s sustained while requests queued" in line
    assert f"probe 0's row: {achieved:.2f} req/s achieved over the whole run" in line


def test_independent_runs_around_the_capacity(capacity_doc):
    """Runs 15% above the answer miss the SLO and runs 15% below meet it, measured by the
    run summary's own goodput accounting rather than the search's."""
    doc, _ = capacity_doc
    slo = parse_attainment_slo(SLO)
    base = run_spec(workload="sharegpt", engine=EngineArgs(
        engine="sim", model="llama-3-8b", gpu="h200", max_num_seqs=8))
    sizing = ProbeSizing(num_requests=200, min_duration_s=20)

    def attainment(rate: float) -> float:
        result = execute_run(probe_spec(base, rate, sizing, slo))
        return result.summary.slo_attainment

    assert attainment(doc["capacity"] * 0.85) >= slo.attainment
    assert attainment(doc["capacity"] * 1.15) < slo.attainment


def test_the_file_holds_the_command_as_a_run_records_it(capacity_doc):
    doc, _ = capacity_doc
    assert doc["command"].startswith(f"cbbench capacity --slo {SLO} --engine sim ")
    assert " --reuse-prompts --out " in doc["command"]
