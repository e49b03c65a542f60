"""`--gpu-metrics URL` (issue 40): a DCGM exporter's page scraped during a run against `cbbench
serve --engine sim`, reported as the NVML telemetry is; a page that is down, slow, huge or
malformed costs the telemetry (a warning), never the run.

The fake exporter serves dcgm-exporter's real metric names and labels for two GPUs."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from helpers import SERVE_MODEL, free_port, serve_process, wait_until
from typer.testing import CliRunner

from cbbench.bench import dcgm
from cbbench.cli.app import app

NUM_REQUESTS = 12
DRAM = {0: 0.62, 1: 0.31}  # DCGM_FI_PROF_DRAM_ACTIVE per GPU: a ratio
SM = {0: 0.80, 1: 0.40}
FB_USED_MIB = 70_000
SLOW_S = 1.0  # the slow page's delay, past the test's scrape timeout
TEST_TIMEOUT_S = 0.2
TEST_MAX_BYTES = 64 << 10


def dcgm_page(host: str = "gpu-node-1") -> str:
    """What dcgm-exporter 3.x serves: # HELP / # TYPE, one series per GPU with its labels."""
    fields = [
        ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: 1980),
        ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: 2619),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: 512.5 + g),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: FB_USED_MIB),
        ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.",
         lambda g: SM[g]),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.",
         lambda g: 0.25),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active "
         "sending or receiving data.", lambda g: DRAM[g]),
    ]
    lines = []
    for name, help_text, value in fields:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for g in (0, 1):
            labels = (f'gpu="{g}",UUID="GPU-{g}a1b2c3d4-0000-0000-0000-00000000000{g}",'
                      f'pci_bus_id="00000000:{0x18 + g:02X}:00.0",device="nvidia{g}",'
                      f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
                      'DCGM_FI_DRIVER_VERSION="550.54.15"')
            lines.append(f"{name}{{{labels}}} {value(g)}")
    return "\n".join(lines) + "\n"


class FakeExporter:
    """A dcgm-exporter on 127.0.0.1: ``mode`` ok | slow | huge | malformed | http500."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.hits = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                exporter.hits += 1
                if exporter.mode == "http500":
                    self.send_error(500)
                    return
                if exporter.mode == "slow":
                    time.sleep(SLOW_S)
                body = {
                    "huge": dcgm_page() + "# padding\n" * (TEST_MAX_BYTES // 8),
                    "malformed": 'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0" 0.5\n{{{ not prometheus\n',
                }.get(exporter.mode, dcgm_page()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass  # the scraper hung up (a page past its byte cap)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeExporter:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def sim_server():
    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200") as run:
        yield run


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "short.jsonl"
    path.write_text("".join(json.dumps({"prompt_len": 32 + i, "output_len": 48}) + "\n"
                            for i in range(NUM_REQUESTS)))
    return path


@pytest.fixture(autouse=True)
def small_limits(monkeypatch):
    monkeypatch.setattr(dcgm, "SCRAPE_TIMEOUT_S", TEST_TIMEOUT_S)
    monkeypatch.setattr(dcgm, "MAX_PAGE_BYTES", TEST_MAX_BYTES)


def run_with(sim_server, workload, tmp_path, *urls: str):
    out = tmp_path / "r.json"
    args = ["run", "--endpoint", sim_server.url, "--workload", str(workload), "--num-requests",
            str(NUM_REQUESTS), "--request-rate", "20", "--telemetry-interval", "0.05",
            "--output", str(out), "--quiet"]
    for u in urls:
        args += ["--gpu-metrics", u]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    # The run itself is whole whatever the page did.
    assert result["summary"]["completed"] == NUM_REQUESTS, r.output
    assert result["summary"]["failed"] == 0
    return r, result


def test_two_gpus_scraped_during_a_run(sim_server, workload, tmp_path):
    from cbbench.analysis.comparison.compare import Labeled
    from cbbench.analysis.table import telemetry_line
    from cbbench.report import plots
    from cbbench.schema import read_run

    with FakeExporter() as fake:
        r, result = run_with(sim_server, workload, tmp_path, fake.url)
    tel = result["telemetry"]
    assert tel["source"] == "dcgm" and tel["available"] is True and tel["error"] is None
    assert tel["metric"] == "dram_active_dcgm"
    assert tel["gpu_indices"] == [0, 1]
    samples = tel["samples"]
    by_gpu = {g: [s for s in samples if s["gpu"] == g] for g in (0, 1)}
    assert len(by_gpu[0]) >= 3 and len(by_gpu[0]) == len(by_gpu[1])
    for g, ss in by_gpu.items():
        for s in ss:
            assert s["dram_bw_util_pct"] == pytest.approx(DRAM[g] * 100)  # the ratio x 100
            assert s["sm_util_pct"] == pytest.approx(SM[g] * 100)
            assert s["tensor_active_pct"] == pytest.approx(25.0)
            assert s["memory_used_bytes"] == FB_USED_MIB << 20
            assert (s["sm_clock_mhz"], s["mem_clock_mhz"]) == (1980, 2619)
            assert s["power_w"] == pytest.approx(512.5 + g)
            assert s["hostname"] == "gpu-node-1" and s["uuid"].startswith(f"GPU-{g}")
    # On the run's clock: inside the run, from its start.
    duration = result["summary"]["duration_s"]
    times = [s["t_s"] for s in samples]
    # (The sampling stops when the target returns: its teardown, seconds on a loaded machine,
    # may add samples past the last request, as with NVML.)
    assert min(times) >= 0 and max(times) <= duration + 10.0
    assert max(times) - min(times) > duration / 2
    assert any(s["t_s"] <= duration / 2 for s in samples)  # inside the run, not only after
    assert times == sorted(times)
    # The steady-state summary and its printed line, as for NVML (pooled over the two GPUs).
    steady = tel["summary"]["steady"]["dram_bw_util_pct"]
    assert steady["mean"] == pytest.approx((DRAM[0] + DRAM[1]) * 50, rel=0.05)
    line = telemetry_line(tel)
    assert line.startswith("GPU telemetry (dram_active_dcgm, steady state): HBM util mean")
    # "steady state" is the run's own window, not the middle 80% of the samples' span (the
    # line said the one and took the other).
    win = tel["summary"]["window"]
    assert [win["start_s"], win["end_s"]] == result["summary"]["steady_state"]["window_s"]
    assert win["rule"] == "given by caller"
    assert line in r.output
    # The report's plot draws the measured series, and the file reads back through the schema.
    t, pct = plots.telemetry_bandwidth(result)
    assert len(t) == len(samples)
    fig = plots.bandwidth_timeline([Labeled("dcgm", result)])
    labels = [ln.get_label() for ax in fig.axes for ln in ax.get_lines()]
    assert any("measured" in label for label in labels), labels
    # One line per GPU, each flat at its own exporter value (pooled, the two GPUs' samples
    # interleaved into one line that zig-zagged between them), named by GPU and by DCGM.
    measured = [ln for ax in fig.axes for ln in ax.get_lines() if "measured" in ln.get_label()]
    assert sorted(ln.get_label() for ln in measured) == [
        "measured (DCGM) gpu-node-1 GPU 0", "measured (DCGM) gpu-node-1 GPU 1"]
    peak = plots.peak_bw_gbps(result)
    for ln, dram in zip(sorted(measured, key=lambda ln: ln.get_label()), (DRAM[0], DRAM[1])):
        ys = np.asarray(ln.get_ydata(), dtype=float)
        want = dram * 100 * (peak / 100 if peak else 1.0)
        assert np.allclose(ys, want), (ln.get_label(), ys[:5], want)
    read_run(tmp_path / "r.json")


def test_a_sweep_scrapes_each_point(sim_server, workload, tmp_path):
    out = tmp_path / "sweep"
    with FakeExporter() as fake:
        r = CliRunner().invoke(app, [
            "sweep", "--endpoint", sim_server.url, "--workload", str(workload), "--rates", "20",
            "--num-requests", str(NUM_REQUESTS), "--min-duration", "0", "--out-dir", str(out),
            "--gpu-metrics", fake.url, "--telemetry-interval", "0.05", "--skip-warmup"])
    assert r.exit_code == 0, r.output
    point = json.loads((out / "sweep.json").read_text())["points"][0]
    assert point["telemetry"]["source"] == "dcgm"
    mean = point["telemetry"]["steady_mean"]["dram_bw_util_pct"]
    assert mean == pytest.approx((DRAM[0] + DRAM[1]) * 50, rel=0.05)
    run = json.loads((out / "rate-20.json").read_text())
    assert {s["gpu"] for s in run["telemetry"]["samples"]} == {0, 1}


@pytest.mark.parametrize("mode, why", [
    ("down", "cannot connect"),
    ("slow", "within"),
    ("huge", "larger than"),
    ("malformed", "not a Prometheus text page"),
    ("http500", "HTTP 500"),
])
def test_a_bad_page_costs_only_the_telemetry(sim_server, workload, tmp_path, mode, why):
    if mode == "down":
        url, fake = f"http://127.0.0.1:{free_port()}/metrics", None
    else:
        fake = FakeExporter(mode).__enter__()
        url = fake.url
    try:
        t0 = time.monotonic()
        r, result = run_with(sim_server, workload, tmp_path, url)
        elapsed = time.monotonic() - t0
    finally:
        if fake is not None:
            fake.__exit__()
    tel = result["telemetry"]
    assert tel["source"] == "dcgm" and tel["available"] is False
    assert why in tel["reason"], tel["reason"]
    assert tel["samples"] == []
    assert tel["scrapes"][0]["ok"] == 0 and tel["scrapes"][0]["failed"] >= 1
    if fake is not None:
        assert fake.hits >= 1  # the page was asked for: the failure happened, and was caught
    assert "warning: GPU telemetry unavailable: no DCGM page could be read" in r.output
    assert "GPU telemetry: unavailable" in r.output  # the summary's telemetry line says so
    # The scrape's own wait never held the run's end: stop() leaves a stuck read behind.
    assert elapsed < result["summary"]["duration_s"] + 10 * SLOW_S


def test_one_page_down_keeps_the_other(sim_server, workload, tmp_path):
    down = f"http://user:secret@127.0.0.1:{free_port()}/metrics?token=x"
    with FakeExporter() as fake:
        r, result = run_with(sim_server, workload, tmp_path, fake.url, down)
    tel = result["telemetry"]
    assert tel["available"] is True and {s["gpu"] for s in tel["samples"]} == {0, 1}
    assert "cannot connect" in tel["error"]
    assert "warning: GPU telemetry stopped early" in r.output
    # The URL's credentials stay out of the result.
    text = (tmp_path / "r.json").read_text()
    assert "secret" not in text and "token=x" not in text


def test_gpu_metrics_bad_input():
    r = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu-metrics", "gpu-host:9400"])
    assert r.exit_code == 2 and "--gpu-metrics" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu-metrics",
                                 "http://h:9400/metrics", "--gpu-index", "0"])
    assert r.exit_code == 2 and "--gpu-index" in r.output


def test_scraper_parses_and_maps_without_profiling_fields():
    """An exporter without DCGM_FI_PROF_* (profiling off): the memory-copy utilization, named
    as the memory controller's busy percentage, one metric for the result."""
    page = ('DCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",UUID="GPU-x",Hostname="h"} 37\n'
            'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x",Hostname="h"} 90\n')
    clock = iter(range(100)).__next__
    s = dcgm.DcgmScraper(["http://x/metrics"], 0.01, clock=lambda: float(clock()),
                         fetch=lambda url: page)
    s.start()
    wait_until(lambda: s.to_result()["samples"], 10.0, "a scrape")
    s.stop()
    tel = s.to_result()
    assert tel["metric"] == "memory_controller_busy"
    assert tel["samples"][0]["dram_bw_util_pct"] == 37 and tel["samples"][0]["sm_util_pct"] == 90
    assert tel["samples"][0]["t_s"] == 0.5  # the middle of the read: clock 0 before, 1 after


def test_two_hosts_gpu_0_are_two_gpus():
    """dcgm-exporter labels each GPU with its gpu index, UUID and Hostname: two hosts' pages
    (here one federated page) both have gpu="0", and each GPU keeps its own figures and
    energy (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ) instead of merging by index."""
    from cbbench.analysis.summary.telemetry import summarize

    def page(e1: int, e2: int) -> str:
        return (
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-aaa",Hostname="node1"}} 90\n'
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-bbb",Hostname="node2"}} 10\n'
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
            f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="GPU-aaa",Hostname="node1"}} {e1}\n'
            f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="GPU-bbb",Hostname="node2"}} {e2}\n'
        )

    samples = [dcgm.to_sample(r, t, profiling=False)
               for t, text in ((0.0, page(1_000_000, 7_000_000)), (10.0, page(4_000_000, 8_000_000)))
               for r in dcgm.parse_page(text)]
    gpus = summarize(samples)["gpus"]
    assert [(g["hostname"], g["uuid"], g["gpu"]) for g in gpus] == [
        ("node1", "GPU-aaa", 0), ("node2", "GPU-bbb", 0)]
    assert [g["run"]["sm_util_pct"]["mean"] for g in gpus] == [90.0, 10.0]
    assert [g["energy_consumption_j"] for g in gpus] == [3000.0, 1000.0]
    assert summarize(samples)["energy_consumption_j"] == 4000.0
