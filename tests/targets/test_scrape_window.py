"""The server's latency from vLLM's histograms reads the run's window, or says it cannot
(the seventh review): a scrape that failed at the end silently served the last good one as
"after" (a server TTFT p50 of 19 ms beside the client's 542, from 25 of 60 requests); a
server restart whose new count passed the baseline's gave a difference of two processes (an
E2EL mean of 29 ms where the restarted server's was 239); a lone +Inf bucket gave a p50 of
0 ms. Truths by hand, and against the fake OpenAI server on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import pytest
from fake_openai import FakeOpenAI, endpoint_options, histogram_page, prompt_requests

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.histogram_window import FELL_UNSEEN
from cbbench.analysis.server_side.prom_text import Dropped
from cbbench.analysis.server_side.server_latency import (
    histogram_quantile,
    quantile_bucket,
    run_server_latency,
)
from cbbench.analysis.table import server_latency_table
from cbbench.targets.http import run_http
from cbbench.targets.scrape import MetricsScraper

TTFT = "vllm:time_to_first_token_seconds"


def _page(series: dict[str, tuple[float, float, float, float]]) -> str:
    """A TTFT histogram with buckets 0.1 s, 1 s, +Inf: {model: (<=0.1, <=1, sum, count)}."""
    lines = [f"# TYPE {TTFT} histogram"]
    for model, (low, mid, total_s, count) in series.items():
        lab = f'model_name="{model}"'
        lines += [f'{TTFT}_bucket{{le="0.1",{lab}}} {low}',
                  f'{TTFT}_bucket{{le="1.0",{lab}}} {mid}',
                  f'{TTFT}_bucket{{le="+Inf",{lab}}} {count}',
                  f"{TTFT}_sum{{{lab}}} {total_s}", f"{TTFT}_count{{{lab}}} {count}"]
    return "\n".join(lines) + "\n"


def _records(n: int) -> list[RequestRecord]:
    return [RequestRecord(id=i, prompt_tokens=1, output_tokens=1, intended_start_s=0.0,
                          send_s=0.0, token_times_s=[0.5]) for i in range(n)]


SCRAPES = {"gave_up": False, "final_ok": True}
# Model "m" restarts between the scrapes; model "n" (another engine) does not.
BEFORE = _page({"m": (40, 50, 10.0, 50), "n": (5, 5, 1.0, 5)})
LAST_BEFORE_RESTART = _page({"m": (42, 60, 16.0, 60), "n": (7, 7, 1.2, 7)})
AFTER = _page({"m": (1, 70, 35.0, 70), "n": (9, 9, 1.4, 9)})


def test_a_restart_mid_run_is_summed_over_its_pieces_by_hand():
    """m: 10 observations (sum 6 s) before its restart, 70 (sum 35 s) after, from 0; n: 4
    (sum 0.4 s). 84 observations, sum 41.4 s: mean 492.857 ms; p50 rank 42 in (0.1, 1]
    holding 77 of them above the 7 below: 0.1 + 0.9 * 35 / 77 s. The after-less-before
    difference read m's 70 - 50 = 20 observations (mean 1,250 ms), its 0.1 s bucket -39."""
    hist = {"before": BEFORE, "after": AFTER, "complete": True, "restarts": [
        {"t_s": 1.5, "before": LAST_BEFORE_RESTART, "series": [[TTFT, {"model_name": "m"}]]}]}
    lat = run_server_latency(hist, SCRAPES, _records(84), Dropped())
    ttft = lat["ttft_ms"]
    assert ttft["observations"] == 84 and ttft["client_requests"] == 84
    assert ttft["server_mean"] == pytest.approx(1000 * 41.4 / 84)
    assert ttft["server_p50"] == pytest.approx(1000 * (0.1 + 0.9 * 35 / 77))
    assert "restarted during the run (seen at t=1.5 s)" in lat["warning"]
    assert "fewer observations" not in lat["warning"]
    assert "note: the server restarted" in server_latency_table({"server_latency": lat})


def test_a_restart_no_scrape_saw_leaves_the_family_out_with_the_reason():
    """The same pages without the restart between them: m's 0.1 s bucket fell (40 -> 1) while
    its count rose (50 -> 70); the family is missing, with why, not a 1,250 ms mean."""
    hist = {"before": BEFORE, "after": AFTER, "complete": True, "restarts": []}
    lat = run_server_latency(hist, SCRAPES, _records(84), Dropped())
    ttft = lat["ttft_ms"]
    assert ttft["missing"] == FELL_UNSEEN and "server_mean" not in ttft
    table = server_latency_table({"server_latency": lat})
    assert "TTFT: missing: its counts fell" in table


def test_fewer_observations_than_completed_requests_is_said():
    """A window that holds 10 of the run's 60 requests: the diff compares different requests,
    and the result and the table say so."""
    hist = {"before": _page({"m": (0, 0, 0.0, 0)}), "after": _page({"m": (2, 10, 6.0, 10)}),
            "complete": True, "restarts": []}
    lat = run_server_latency(hist, SCRAPES, _records(60), Dropped())
    assert lat["ttft_ms"]["observations"] == 10 and lat["ttft_ms"]["client_requests"] == 60
    assert "TTFT 10 < 60" in lat["warning"]
    assert "compares different requests" in server_latency_table({"server_latency": lat})


def test_a_lone_inf_bucket_has_no_quantile():
    """Prometheus' bucketQuantile: NaN with fewer than 2 buckets (this gave 0 ms)."""
    assert histogram_quantile(0.5, {float("inf"): 7}) is None
    assert quantile_bucket(0.5, {float("inf"): 7}) is None
    assert histogram_quantile(0.5, {0.1: 3, float("inf"): 7}) == 0.1  # beyond the last bound


def test_restart_seen_from_counts_and_created():
    """The scraper's test, scrape to scrape: a count that fell, or a _created that changed
    (a restart whose count already passed the old one), marks that label set only."""
    s = MetricsScraper("http://unused", {})

    def scrape(t: float, m_count: float, n_count: float, m_created: float) -> None:
        lines = [f'{TTFT}_count{{model_name="m"}} {m_count}',
                 f'{TTFT}_created{{model_name="m"}} {m_created}',
                 f'{TTFT}_count{{model_name="n"}} {n_count}']
        s._note_restart(t, s._marks_of(lines))
        s.histograms = [s.histograms[0], f"page@{t}"] if s.histograms else [f"page@{t}"]

    scrape(0.0, 50, 5, 100.0)
    scrape(0.5, 60, 7, 100.0)
    assert s.restarts == []
    scrape(1.0, 3, 8, 200.0)  # m restarted: its count fell
    scrape(1.5, 90, 9, 300.0)  # m again: 90 > 3, but a new birth time
    assert [(r["t_s"], r["before"], r["series"]) for r in s.restarts] == [
        (1.0, "page@0.5", [[TTFT, {"model_name": "m"}]]),
        (1.5, "page@1.0", [[TTFT, {"model_name": "m"}]]),
    ]


def test_a_final_scrape_that_fails_leaves_the_latency_out_and_says_so(notices):
    """/metrics answers the baseline and the run's first scrape, then 404: the histograms'
    "after" is the run's first instant, not its end. Before, summary.http.server_latency
    compared 0 of the run's 4 requests with the client's, and nothing was said."""
    calls = []

    def page(fake: FakeOpenAI) -> str:
        calls.append(len(fake.ttft_s))
        if len(calls) >= 2:
            fake.metrics = False  # from the next scrape on: 404
        return f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {fake.in_flight}\n" \
            + histogram_page(TTFT, fake.ttft_s)

    with FakeOpenAI(metrics_page=page) as s:
        n = 4
        run = run_http(endpoint_options(s.url, scrape_metrics=True),
                       prompt_requests(["delay:0.06"] * n, output_len=2), np.arange(n) * 0.3)
    assert all(r.ok for r in run.records)
    scrapes = run.info["server_metrics_scrapes"]
    assert scrapes["final_ok"] is False and scrapes["failed"] >= 1 and not scrapes["gave_up"]
    assert run.info["server_histograms"]["complete"] is False
    lat = run.info["server_latency"]
    assert set(lat) == {"missing", "note"} and "the scrape after the run failed" in lat["missing"]
    said = [x for x in notices if "metrics" in x]
    assert len(said) == 1 and "none was read after the run" in said[0], said
    assert "HTTP 404" in said[0]
    assert server_latency_table({"server_latency": lat}).startswith(
        "server latency (vLLM histograms): missing: the scrape after the run failed")


def test_a_restart_mid_run_against_the_fake_server():
    """The fake 'restarts' at its 3rd /metrics call: from then on its page holds only what it
    observed since. 3 earlier requests are in the baseline; the run's 8 pass that count after
    the restart. Truth: the fake's own TTFTs up to the scrape before the restart, and after
    it (those between the two are lost, as a real restart loses them)."""
    seen: list[int] = []  # len(fake.ttft_s) at each call

    def page(fake: FakeOpenAI) -> str:
        seen.append(len(fake.ttft_s))
        start = seen[2] if len(seen) >= 3 else 0
        return histogram_page(TTFT, fake.ttft_s[start:])

    with FakeOpenAI(metrics_page=page) as s:
        run_http(endpoint_options(s.url), prompt_requests(["x"] * 3, output_len=2), np.zeros(3))
        n = 8
        run = run_http(endpoint_options(s.url, scrape_metrics=True),
                       prompt_requests(["delay:0.02"] * n, output_len=2), np.arange(n) * 0.2)
        ttfts = list(s.ttft_s)
    assert len(seen) >= 4 and len(ttfts) == 3 + n
    truth = ttfts[3:seen[1]] + ttfts[seen[2]:]  # the baseline is call 0
    hist = run.info["server_histograms"]
    assert [r["t_s"] > 0 for r in hist["restarts"]] == [True]
    ttft = run.info["server_latency"]["ttft_ms"]
    assert ttft["observations"] == len(truth)
    assert ttft["server_mean"] == pytest.approx(1000 * sum(truth) / len(truth), rel=1e-6)
    assert "restarted during the run" in run.info["server_latency"]["warning"]
