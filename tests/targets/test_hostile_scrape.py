"""What a server sends never costs a finished run (issue 25, rule 2).

A /metrics page with a malformed vLLM histogram (no `le`, `le="abc"`, `_count +Inf`) turned a
completed run into a traceback and no result file (with --workers: exit 3 and a false "worker
did not finish"); a large page was kept whole on every scrape (a 4-request run took 54 s, a
5 s run wrote 173 MB) and each scrape stalled the client's loop. Now a bad series is dropped
and counted (one warning), a scrape keeps a bounded number of series, the time series is
thinned past a bound, and pages are parsed in a thread. All against the fake OpenAI server on
127.0.0.1.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from fake_openai import MODEL, FakeOpenAI, endpoint_options, histogram_page, prompt_requests
from helpers import invoke_app

from cbbench.analysis.server_side.prom_text import Dropped
from cbbench.analysis.server_side.server_latency import histograms
from cbbench.targets import scrape
from cbbench.targets.http import run_http

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
BAD_SERIES = {
    "no-le": f'{TTFT}_bucket{{model_name="m"}} 3\n',
    "le-abc": f'{TTFT}_bucket{{le="abc",model_name="m"}} 3\n',
    "count-inf": f'{TTFT}_count{{model_name="x"}} +Inf\n',
    "garbage": f'{TTFT}_bucket{{le="0.5" 3 3 3\n',
}


def _page_with(bad: str):
    """A good TPOT histogram and the fake's TTFT histogram with one malformed series."""
    def page(fake: FakeOpenAI) -> str:
        return (histogram_page(TTFT, fake.ttft_s) + bad
                + histogram_page(TPOT, [0.01] * len(fake.ttft_s)))

    return page


def _run_cli(url: str, out, *extra):
    return invoke_app([
        "run", "--endpoint", url, "--served-model", MODEL, "--workload", "random",
        "--input-len", "8", "--output-len", "3", "--num-requests", "4", "--request-rate", "20",
        "--scrape-metrics", "--output", str(out), *extra,
    ])


@pytest.mark.parametrize("kind", sorted(BAD_SERIES))
def test_a_malformed_histogram_never_costs_the_run(tmp_path, kind):
    with FakeOpenAI(metrics_page=_page_with(BAD_SERIES[kind])) as s:
        out = tmp_path / "r.json"
        res = _run_cli(s.url, out)
    assert res.exit_code == 0, (res.output, res.exception)
    result = json.loads(out.read_text())  # the result file is written
    assert result["summary"]["completed"] == 4
    said = [ln for ln in res.stderr.splitlines() if "malformed /metrics" in ln]
    assert len(said) == 1, res.stderr  # one warning for the run
    http = result["summary"]["http"]
    assert http["server_metrics_scrapes"]["dropped_series"] >= 1
    # The page's other series stand: the TPOT histogram is still read.
    assert http["server_latency"]["tpot_ms"]["observations"] == 4


def test_a_malformed_histogram_with_workers_is_not_a_lost_worker(tmp_path):
    with FakeOpenAI(metrics_page=_page_with(BAD_SERIES["le-abc"])) as s:
        out = tmp_path / "r.json"
        res = _run_cli(s.url, out, "--workers", "2")
    assert res.exit_code == 0, (res.output, res.exception)  # was 3: "worker did not finish"
    assert "did not finish" not in res.stderr
    result = json.loads(out.read_text())
    assert result["summary"]["completed"] == 4


def test_parse_histograms_drops_bad_series_and_keeps_the_rest():
    page = histogram_page(TTFT, [0.01, 0.2]) + "".join(BAD_SERIES.values()) + (
        f'{TTFT}_bucket{{le="-1",model_name="m"}} 1\n'  # a negative bound
        f'{TTFT}_bucket{{le="0.5",model_name="n"}} -4\n'  # a negative count
    )
    dropped = Dropped()
    hist = histograms(page, dropped)
    assert dropped.count == 6
    h = hist[TTFT]
    assert h.count == 2 and h.buckets[float("inf")] == 2 and h.buckets[0.05] == 1


LARGE_SERIES = 60_000


def test_a_large_page_is_capped_and_parsed_off_the_loop(monkeypatch):
    """60k gauge series a scrape (a 2.6 MB page): what a scrape keeps is capped at
    MAX_SERIES_PER_SCRAPE, the cut is counted, and pages are digested in a worker thread."""
    page = "# TYPE vllm:big gauge\n" + "".join(
        f'vllm:big{{i="{i}"}} {i}\n' for i in range(LARGE_SERIES))
    threads = []
    digest = scrape.MetricsScraper._digest

    def spy(self, *a):
        threads.append(threading.current_thread() is threading.main_thread())
        return digest(self, *a)

    monkeypatch.setattr(scrape.MetricsScraper, "_digest", spy)
    with FakeOpenAI(metrics_page=lambda fake: page) as s:
        run = run_http(endpoint_options(s.url, scrape_metrics=True), prompt_requests(["x"] * 4),
                       np.arange(4) * 0.2)
    info = run.info
    assert len(run.records) == 4 and all(r.ok for r in run.records)
    scrapes = info["server_metrics_scrapes"]
    per_scrape: dict[float, int] = {}
    for row in info["server_metrics"]:
        per_scrape[row["t_s"]] = per_scrape.get(row["t_s"], 0) + 1
    assert per_scrape and max(per_scrape.values()) <= scrape.MAX_SERIES_PER_SCRAPE
    assert scrapes["series_beyond_cap"] >= LARGE_SERIES - scrape.MAX_SERIES_PER_SCRAPE
    assert threads and not any(threads)  # never on the event loop's thread


def test_the_time_series_is_bounded(monkeypatch):
    """Past MAX_SCRAPES_KEPT kept scrapes the series is thinned (every other dropped) and
    from then on every other scrape is kept: bounded, first and last scrapes kept."""
    monkeypatch.setattr(scrape, "MAX_SCRAPES_KEPT", 4)
    monkeypatch.setattr(scrape, "SCRAPE_INTERVAL_S", 0.02)
    with FakeOpenAI() as s:
        run = run_http(endpoint_options(s.url, scrape_metrics=True), prompt_requests(["delay:0.3"] * 2),
                       np.zeros(2))
    scrapes = run.info["server_metrics_scrapes"]
    kept = sorted({row["t_s"] for row in run.info["server_metrics"]})
    assert scrapes["ok"] > 8  # enough scrapes to thin more than once
    assert len(kept) <= 4 + 1 and scrapes["kept_every"] >= 2
