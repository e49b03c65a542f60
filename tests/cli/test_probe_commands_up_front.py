"""`sweep` and `capacity` refuse, before the first probe, what would fail or be lost after it:
outputs that collide (capacity's --out and --runs-dir one path, --out named as a probe's file,
--runs-dir inside --out), a folder standing where a point's or probe's file or the plot goes,
a --start-rate whose schedule no run takes, and --points beside explicit --rates (it did
nothing there: `--rates 1 --points 1000` passed, past --points' range of [1, 100]). Each refusal is exit 2, one stderr line, nothing on stdout, nothing measured
or written. Before, capacity ran the whole search, printed its table, then exited 2 with the
capacity file lost; or silently overwrote probe 1's result with the capacity file; a sweep
measured rate 2, then failed, that point lost and sweep.json saying it was not interrupted."""

from __future__ import annotations

import json
import math

import pytest
from helpers import cli_in_process

from cbbench.bench.capacity import ABOVE_MAX, BELOW_MIN, Probe, search
from cbbench.bench.probe import ProbePoint, ProbeSizing

SIM = ["--engine", "sim", "--workload", "random", "--num-requests", "3", "--min-duration", "0"]
CAPACITY = ["capacity", *SIM, "--slo", "ttft_p90=200", "--start-rate", "5"]
SWEEP = ["sweep", *SIM]


def refused(res, *words: str) -> str:
    assert res.returncode == 2, (res.args, res.stdout, res.stderr)
    assert res.stdout == ""  # no table: nothing ran
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), res.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def files_in(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---- capacity: --out against --runs-dir -----------------------------------------------------


def test_capacity_out_and_runs_dir_one_path_is_refused_before_the_search(tmp_path):
    res = cli_in_process([*CAPACITY, "--out", "same.json", "--runs-dir", "same.json"],
                         cwd=tmp_path)
    refused(res, "--out same.json", "--runs-dir same.json", "one path")
    assert files_in(tmp_path) == []  # not even the folder


def test_capacity_out_named_as_a_probe_file_is_refused(tmp_path):
    res = cli_in_process([*CAPACITY, "--runs-dir", "rr", "--out", "rr/probe-1-rate-5.json"],
                         cwd=tmp_path)
    refused(res, "--out rr/probe-1-rate-5.json", "a probe's result")
    assert files_in(tmp_path) == []


def test_capacity_runs_dir_inside_out_is_refused(tmp_path):
    res = cli_in_process([*CAPACITY, "--runs-dir", "c.json/probes", "--out", "c.json"],
                         cwd=tmp_path)
    refused(res, "--runs-dir c.json/probes lies inside --out c.json")
    assert files_in(tmp_path) == []


def test_capacity_refuses_a_folder_where_a_probe_file_goes(tmp_path):
    (tmp_path / "rr" / "probe-2-rate-10.json").mkdir(parents=True)
    res = cli_in_process([*CAPACITY, "--runs-dir", "rr", "--out", "c.json"], cwd=tmp_path)
    refused(res, "--runs-dir rr", "probe-2-rate-10.json is a folder")
    assert files_in(tmp_path / "rr") == ["probe-2-rate-10.json"]
    assert not (tmp_path / "c.json").exists()


def test_capacity_file_beside_its_probes_in_one_folder_still_works(tmp_path):
    res = cli_in_process([*CAPACITY, "--runs-dir", "rr", "--out", "rr/capacity.json"],
                         cwd=tmp_path)
    assert res.returncode in (0, 1), res.stderr  # found, or not found: the search ran
    doc = json.loads((tmp_path / "rr" / "capacity.json").read_text())
    assert doc["probes"]
    probe_files = [n for n in files_in(tmp_path / "rr") if n != "capacity.json"]
    assert len(probe_files) == len(doc["probes"])
    assert probe_files and all(n.startswith("probe-") for n in probe_files)


# ---- capacity: rates --------------------------------------------------------------------------


def test_capacity_start_rate_without_a_schedule_is_one_line_before_probe_1(tmp_path):
    res = cli_in_process([*CAPACITY[:-1], "1e-300", "--out", "c.json"], cwd=tmp_path)
    refused(res, "--start-rate", "1e-300 req/s", "30 days")
    assert files_in(tmp_path) == []


def test_capacity_halving_stops_where_the_schedule_would_not_fit(tmp_path):
    """2 requests at 1e-6 req/s span 2e6 s (inside the 30-day limit), at half that 4e6 s: the
    search ends not-found after probe 1, its file written, instead of dying in probe 2."""
    res = cli_in_process(["capacity", "--engine", "sim", "--workload", "random",
                          "--num-requests", "2", "--min-duration", "0", "--arrival", "constant",
                          "--slo", "ttft_p90=0.001", "--start-rate", "1e-6", "--out", "c.json"],
                         cwd=tmp_path)
    assert res.returncode == 1, res.stderr  # not found: no probed rate met the SLO
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["status"] == BELOW_MIN and [p["rate"] for p in doc["probes"]] == [1e-6]


def _fake(threshold: float, seen: list[float]):
    """A target that meets the SLO at or below `threshold` req/s, recording each rate."""

    def probe(rate: float, phase: str) -> Probe:
        seen.append(rate)
        ok = rate <= threshold
        point = ProbePoint(rate, 100, 100, 0, rate, rate * 100, *([1.0] * 7), None,
                           1.0 if ok else 0.5, True, "", "yes")
        return Probe(len(seen), phase, point, point.slo_attainment, ok, ok)

    return probe


def test_search_never_probes_a_rate_whose_schedule_does_not_fit():
    sizing = ProbeSizing(num_requests=10, min_duration_s=0.0)
    seen: list[float] = []
    found = search(_fake(0.0, seen), 1e-4, fits=sizing.schedule_fits)
    assert found.status == BELOW_MIN
    assert seen and all(sizing.schedule_fits(r) for r in seen)
    assert not sizing.schedule_fits(seen[-1] / 2)  # it stopped at the floor, not before


def test_search_never_doubles_past_floats_range():
    seen: list[float] = []
    found = search(_fake(math.inf, seen), 1e306)
    assert found.status == ABOVE_MAX and all(math.isfinite(r) for r in seen)


# ---- sweep ------------------------------------------------------------------------------------


def test_sweep_refuses_a_folder_where_a_points_file_goes(tmp_path):
    (tmp_path / "sw" / "rate-2.json").mkdir(parents=True)
    res = cli_in_process([*SWEEP, "--rates", "1,2", "--out-dir", "sw"], cwd=tmp_path)
    refused(res, "--out-dir sw", "rate-2.json is a folder")
    assert files_in(tmp_path / "sw") == ["rate-2.json"]  # rate 1 never ran


def test_sweep_auto_refuses_any_folder_named_as_a_point(tmp_path):
    """--rates auto's rates are measured: any rate-*.json folder may be where one goes."""
    (tmp_path / "sw" / "rate-7.json").mkdir(parents=True)
    res = cli_in_process([*SWEEP, "--rates", "auto", "--points", "2", "--out-dir", "sw"],
                         cwd=tmp_path)
    refused(res, "rate-7.json is a folder")
    assert files_in(tmp_path / "sw") == ["rate-7.json"]


def test_sweep_with_a_folder_no_listed_rate_takes_runs(tmp_path):
    (tmp_path / "sw" / "rate-7.json").mkdir(parents=True)
    res = cli_in_process([*SWEEP, "--rates", "1", "--out-dir", "sw"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [p["file"] for p in doc["points"]] == ["rate-1.json"]


def test_sweep_refuses_a_folder_where_the_plot_goes(tmp_path):
    (tmp_path / "sw" / "latency_throughput.png").mkdir(parents=True)
    res = cli_in_process([*SWEEP, "--rates", "1", "--out-dir", "sw"], cwd=tmp_path)
    refused(res, "latency_throughput.png is a folder")
    assert files_in(tmp_path / "sw") == ["latency_throughput.png"]


@pytest.mark.parametrize("points", ["1000", "6"])
def test_sweep_points_beside_explicit_rates_is_refused(points, tmp_path):
    res = cli_in_process([*SWEEP, "--rates", "1", "--points", points, "--out-dir", "sw"],
                         cwd=tmp_path)
    refused(res, "--points", "--rates auto", "does nothing")
    assert files_in(tmp_path) == []


def test_sweep_auto_still_checks_the_points_range(tmp_path):
    res = cli_in_process([*SWEEP, "--points", "1000", "--out-dir", "sw"], cwd=tmp_path)
    refused(res, "--points must be in [1, 100], got 1000")
