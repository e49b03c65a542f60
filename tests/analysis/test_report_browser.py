"""The interactive report in a real browser: headless Chromium (Debian's `chromium`; .ci/run
installs it) loads report.html from disk with no network, reports no console error, and every
plot has data, ITL included without --save-detailed. Skipped where Chromium is absent."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
runner = CliRunner()
BROWSER_TIMEOUT_S = 120
CHECK = re.compile(r'<pre id="cbbench-plot-check"[^>]*>(.*?)</pre>', re.S)
CONSOLE_ERROR = re.compile(r"Uncaught|:ERROR:CONSOLE|Error: ", re.I)
EXPECTED_PLOTS = ("latency_cdfs", "over_time", "token_budget", "batch_occupancy", "kv_usage",
                  "bandwidth", "request_timeline", "time_slices")


def _load(page: Path, tmp_path: Path) -> tuple[str, str]:
    """The page's DOM after its scripts ran, and what the browser logged."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=20000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S,
    )
    return proc.stdout, proc.stderr


def _console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line and CONSOLE_ERROR.search(line)]


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    files = []
    for sched in ("static", "continuous"):
        out = tmp / f"{sched}.json"
        res = runner.invoke(app, ["run", "--engine", "sim", "--scheduler", sched, "--label", sched,
                                  "--num-requests", "80", "--slice", "0.5s", "--output", str(out)])
        assert res.exit_code == 0, res.output
        files.append(str(out))
    res = runner.invoke(app, ["report", *files, "--out", str(tmp / "report")])
    assert res.exit_code == 0, res.output
    return tmp / "report" / "report.html"


def test_the_page_loads_with_no_console_error_and_data_in_every_plot(report_page, tmp_path):
    page = report_page.read_text()
    # Nothing fetched, so it opens offline: no element outside the inline scripts points out.
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.S)
    assert "<script" not in markup
    assert not re.search(r'(src|href)="(https?:|//|file:)', markup)
    dom, log = _load(report_page, tmp_path)
    assert _console_errors(log) == []
    m = CHECK.search(dom)
    assert m and m.group(1), f"the loader never ran:\n{log[-2000:]}"
    counts = json.loads(m.group(1))
    assert set(counts) == {f"plot-{k}" for k in EXPECTED_PLOTS}
    assert all(n > 0 for n in counts.values()), counts
    # Plotly drew each plot (its SVG root is in the DOM after the scripts ran).
    assert dom.count('class="main-svg"') >= len(EXPECTED_PLOTS)


def test_itl_is_drawn_without_save_detailed(report_page):
    page = report_page.read_text()
    block = re.search(r'data-plot="plot-latency_cdfs">(.*?)</script>', page, re.S).group(1)
    fig = json.loads(block.replace("<\\/", "</"))
    itl = [t for t in fig["data"] if t.get("xaxis") == "x3"]  # the ITL panel
    assert {t["name"] for t in itl} == {"static", "continuous"}
    assert all(len(t["x"]) > 1 for t in itl)


def test_a_console_error_is_seen(tmp_path):
    """The check above can fail: a page that throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>throw new Error('boom')</script>"
                   "</body></html>")
    _, log = _load(bad, tmp_path)
    assert _console_errors(log), log[-2000:]


def test_a_label_that_opens_an_html_comment_leaves_the_plots_drawn(tmp_path):
    """A run labelled "a<!--<script>": inside a script element "<!--" then "<script" moves a
    browser's tokenizer to a state where "</script>" no longer ends it, so the first plot's
    data block swallowed the rest of the page and Chromium drew no plot at all. The JSON is
    written with every "<" as \\u003c (JSON.parse reads it back as "<")."""
    src = json.loads((Path(__file__).parents[1] / "data" / "results" / "run.json").read_text())
    files = []
    for label in ("plain", "a<!--<script>"):
        src["config"]["label"] = label
        files.append(tmp_path / f"{len(files)}.json")
        files[-1].write_text(json.dumps(src))
    res = runner.invoke(app, ["report", *map(str, files), "--out", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    page = tmp_path / "report" / "report.html"
    blocks = re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', page.read_text(),
                        re.S)
    assert blocks and not any("<" in b for b in blocks)
    dom, log = _load(page, tmp_path)
    m = CHECK.search(dom)
    assert m and m.group(1), f"the loader never ran:\n{log[-2000:]}"
    assert all(n > 0 for n in json.loads(m.group(1)).values())
