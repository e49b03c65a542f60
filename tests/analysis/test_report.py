"""`cbbench report`: every PNG is written and decodes; the HTML page embeds each plot and the
summary table, and says what it could not draw."""

from __future__ import annotations

import base64
import copy
import io
import re

import matplotlib.image as mpimg
import pytest
from helpers import run_spec
from typer.testing import CliRunner

from cbbench.analysis.result import write_result
from cbbench.bench.runner import execute_run
from cbbench.cli.app import app as cli_app
from cbbench.engine.args import EngineArgs
from cbbench.schema import to_dict

NUM_REQUESTS = 64
PLOTS = ("latency_cdfs", "token_budget", "batch_occupancy", "kv_usage", "bandwidth")
GANTT = "request_timeline"

# The real app: its command classes hold the one bad-input boundary (exit 2).
app = cli_app


runner = CliRunner()


def _run(scheduler: str, detailed: bool) -> dict:
    opts = EngineArgs(
        engine="sim", batching=scheduler, chunked_prefill=scheduler == "continuous",
        max_num_seqs=32, num_kv_blocks=400,  # a small pool, so preemptions happen
    )
    spec = run_spec(num_requests=NUM_REQUESTS, save_detailed=detailed, engine=opts)
    return to_dict(execute_run(spec))  # the file's JSON: the tests tamper with it


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return {"static": _run("static", False), "continuous": _run("continuous", True)}


def _files(tmp_path, results: dict[str, dict]) -> list[str]:
    paths = []
    for name, res in results.items():
        path = tmp_path / f"{name}.json"
        write_result(path, res)
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, results):
    """One report of the static/continuous pair, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("pair")
    out = tmp / "report"
    r = runner.invoke(app, ["report", *_files(tmp, results), "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _decode(png: bytes):
    return mpimg.imread(io.BytesIO(png), format="png")


def test_every_plot_is_written_and_embedded(report_dir):
    out = report_dir
    page = (out / "report-static.html").read_text()
    for key in (*PLOTS, GANTT):
        png = (out / f"{key}.png").read_bytes()
        img = _decode(png)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 500
        # The page embeds that very image as a data URI, with no external reference.
        assert f'data-file="{key}.png"' in page
        assert f"data:image/png;base64,{base64.b64encode(png).decode()}" in page
        assert f'href="#{key}"' in page
    assert not re.search(r'(src|href)="(https?:|file:|/)', page)
    assert "<script" not in page


def test_page_has_the_summary_and_config_tables(report_dir):
    page = (report_dir / "report.html").read_text()
    summary = page.split('<div id="summary-table">')[1].split("</div>")[0]
    assert summary.startswith("<table>")
    for label in ("output throughput (tok/s)", "TTFT p99 (ms)", "preemptions", "static",
                  "continuous"):
        assert label in summary
    assert "×)" in summary  # ratios against the first run
    assert "Config differences" in page and "chunked_prefill" in page


def test_page_says_what_is_missing(report_dir):
    page = (report_dir / "report-static.html").read_text()
    # The static run was not --save-detailed: no ITL line for it, and the page says so.
    assert "No ITL line for static" in page and "--save-detailed" in page
    assert "No measured bandwidth for static, continuous" in page


def test_telemetry_is_drawn_when_present(tmp_path, results):
    measured = copy.deepcopy(results["continuous"])
    end = measured["iterations"][-1]["start_s"]
    measured["telemetry"] = {
        "available": True,
        "metric": "dram_bw_util_gpm",
        "samples": [
            {"t_s": end * i / 20, "gpu": 0, "dram_bw_util_pct": 40.0 + i} for i in range(21)
        ],
    }
    out = tmp_path / "report"
    r = runner.invoke(
        app, ["report", *_files(tmp_path, {"measured": measured}), "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    page = (out / "report-static.html").read_text()
    assert "No measured bandwidth" not in page
    assert _decode((out / "bandwidth.png").read_bytes()).ndim == 3


def test_no_timeline_without_a_static_continuous_pair(tmp_path, results):
    out = tmp_path / "report"
    one = {"continuous": results["continuous"]}
    r = runner.invoke(app, ["report", *_files(tmp_path, one), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert not (out / f"{GANTT}.png").exists()
    for key in PLOTS:
        assert (out / f"{key}.png").exists()


def test_timeline_caps_the_requests_drawn(tmp_path, results):
    from cbbench.report import plots

    ids = plots.gantt_rows(results["static"], max_requests=25)
    assert len(ids) == 25 and len(set(ids)) == 25
    # Evenly spread over the whole run: the last admitted request is among them.
    last = max(results["static"]["requests"], key=lambda q: (q["queue_ms"], q["id"]))
    assert last["id"] in ids


def test_usage_errors(tmp_path, results):
    files = _files(tmp_path, results)
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    assert runner.invoke(app, ["report", *files, "--out", str(a_file)]).exit_code == 2
    assert runner.invoke(app, ["report", str(tmp_path / "nope.json"), "--out",
                               str(tmp_path / "r")]).exit_code == 2
    assert runner.invoke(app, ["report", *files, "--out", str(tmp_path / "r"),
                               "--max-gantt-requests", "0"]).exit_code == 2


def test_timeline_panels_share_the_whole_time_span(results):
    from cbbench.analysis.comparison.compare import Labeled
    from cbbench.report import plots

    pair = [Labeled("static", results["static"]), Labeled("continuous", results["continuous"])]
    fig = plots.request_gantt(pair, max_requests=30)
    ends = [
        q.intended_start_s + q.e2el_ms / 1000
        for x in pair for q in x.result.requests if q.e2el_ms is not None
    ]
    for ax in fig.axes:
        assert ax.get_xlim()[1] >= max(ends)  # static's last batch is not cut off


def test_the_config_table_shows_floats_as_people_write_them(tmp_path, results):
    """Issue 35: the config differences showed 9.999999999999999e-06 and 989000000000000.0."""
    a, b = copy.deepcopy(results["continuous"]), copy.deepcopy(results["continuous"])
    a["config"]["gpu_spec"]["bf16_flops"] = 989e12
    a["config"]["gpu_spec"]["collective_latency_s"] = 9.999999999999999e-06
    b["config"]["gpu_spec"]["bf16_flops"] = 1979e12
    b["config"]["gpu_spec"]["collective_latency_s"] = 2e-05
    out = tmp_path / "report"
    r = runner.invoke(app, ["report", *_files(tmp_path, {"a": a, "b": b}), "--out", str(out)])
    assert r.exit_code == 0, r.output
    page = (out / "report.html").read_text()
    table = page.split("Config differences")[1]
    assert "9.89e+14" in table and "1.979e+15" in table and "1e-05" in table
    assert "989000000000000.0" not in page and "9.999999999999999e-06" not in page
    # Two continuous runs are an ordinary report: no note about a static-vs-continuous plot.
    assert "No request timeline" not in page
    assert "No request timeline" not in (out / "report-static.html").read_text()


def test_the_interactive_page_has_the_bandwidth_plot(report_dir):
    """The static page had the bandwidth plot; the interactive one lacked it."""
    page = (report_dir / "report.html").read_text()
    plot = page.split('data-plot="plot-bandwidth">')[1].split("</script>")[0]
    assert '"achieved_bw_gbps"' not in plot and "analytic (HBM)" in plot
    assert "HBM bandwidth" in page


def test_a_cpu_runs_bandwidth_is_not_called_hbm_and_measured_names_its_source(tmp_path,
                                                                               results):
    from cbbench.analysis.comparison.compare import Labeled
    from cbbench.report import interactive, plots

    cpu = copy.deepcopy(results["continuous"])
    cpu["config"]["device"] = "cpu"
    assert plots.bandwidth_title([Labeled("cpu", cpu)]) == "CPU memory bandwidth"
    out = tmp_path / "report"
    r = runner.invoke(app, ["report", *_files(tmp_path, {"cpu": cpu}), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for name in ("report.html", "report-static.html"):
        text = re.sub(r"base64,[A-Za-z0-9+/=]+", "", (out / name).read_text())  # images out
        assert "HBM" not in text and "CPU memory bandwidth" in text, name
    gpu = copy.deepcopy(results["continuous"])
    end = gpu["iterations"][-1]["start_s"]
    gpu["telemetry"] = {"available": True, "source": "dcgm", "metric": "dram_active",
                        "samples": [{"t_s": end * i / 10, "gpu": 0, "dram_bw_util_pct": 50.0}
                                    for i in range(11)]}
    plot = interactive.bandwidth([Labeled("gpu", gpu)])
    names = [t["name"] for t in plot.figure["data"]]
    assert names == ["gpu: analytic (HBM)", "gpu: measured (DCGM)"]
    peak = plots.peak_bw_gbps(gpu)
    assert plot.figure["data"][1]["y"][0] == pytest.approx(peak / 2)  # 50% of the peak, GB/s
