"""--scrape-metrics against the fake server: the servers' metric names kept, the filter, one
warning line when a scrape fails or keeps nothing, and the server's own latency from vLLM's
histograms beside the client's (issue 20)."""

from __future__ import annotations

import numpy as np
import pytest
from fake_openai import (
    LLAMACPP_PAGE,
    MODEL,
    FakeOpenAI,
    endpoint_options,
    prompt_requests,
    vllm_histograms_page,
)
from helpers import invoke_app

from cbbench.errors import UsageError
from cbbench.targets.http import run_http
from cbbench.targets.options import EndpointOptions


def test_scrape_metrics(fresh_fake_server):
    n = 8
    run = run_http(
        endpoint_options(fresh_fake_server.url, scrape_metrics=True), prompt_requests(["delay:0.02"] * n), np.arange(n) * 0.15
    )
    rows = run.info["server_metrics"]
    names = {r["name"] for r in rows}
    assert names == {"vllm:num_requests_running", "vllm:prompt_tokens_total"}
    times = sorted({r["t_s"] for r in rows})
    assert len(times) >= 3 and times[0] < 0.1
    assert rows[0]["labels"] == {"model_name": MODEL}
    assert run.info["server_metrics_scrapes"]["failed"] == 0


def test_scrape_failure_is_not_fatal_and_said_once(notices):
    notes = notices  # the logged notices (conftest)
    with FakeOpenAI(metrics=False) as s:
        run = run_http(
            endpoint_options(s.url, scrape_metrics=True), prompt_requests(["x"] * 3), [0.0, 0.3, 0.6]
        )
    assert all(r.ok for r in run.records)
    scrapes = run.info["server_metrics_scrapes"]
    assert scrapes["failed"] >= 1 and "HTTP 404" in scrapes["errors"][0]
    assert run.info["server_metrics"] == []
    said = [n for n in notes if "metrics" in n]  # (a loaded machine may add a send-lag line)
    assert len(said) == 1 and "GET /metrics failed" in said[0] and "HTTP 404" in said[0]


def test_server_side_ttft_from_vllm_histograms():
    with FakeOpenAI(metrics_page=vllm_histograms_page) as s:
        # Earlier traffic (TTFT ~1 ms: the first buckets) is in the histograms before the run.
        run_http(endpoint_options(s.url), prompt_requests(["x"] * 3, output_len=2), np.zeros(3))
        before = len(s.ttft_s)
        # The run: TTFT and token gaps of 60 ms, all in the (50, 500] ms bucket, so the
        # interpolated p50 is its middle, 275 ms, and the mean is the fake's own mean.
        n = 4
        run = run_http(
            endpoint_options(s.url, scrape_metrics=True), prompt_requests(["delay:0.06"] * n, output_len=3),
            np.arange(n) * 0.01,
        )
        ours = s.ttft_s[before:]
    assert all(0.05 < t <= 0.5 for t in ours) and len(ours) == n
    assert all(t <= 0.05 for t in s.ttft_s[:before])
    lat = run.info["server_latency"]
    ttft = lat["ttft_ms"]
    assert ttft["histogram"] == "vllm:time_to_first_token_seconds"
    assert ttft["observations"] == n  # the run's requests only: the difference of two scrapes
    assert ttft["server_p50"] == pytest.approx(275.0)
    assert ttft["server_mean"] == pytest.approx(1000 * sum(ours) / n, rel=1e-6)
    client = [r.ttft_from_send_s * 1000 for r in run.records]
    assert ttft["client_p50"] == pytest.approx(float(np.percentile(client, 50)))
    assert ttft["diff_p50"] == pytest.approx(ttft["client_p50"] - 275.0)
    assert ttft["client_p50"] >= 60.0  # the client cannot see the first token before the server sent it
    assert ttft["server_p50_bucket"] == [50.0, 500.0] and ttft["client_within_bucket"]
    itl = lat["itl_ms"]
    assert itl["histogram"] == "vllm:time_per_output_token_seconds"
    assert itl["observations"] == n * 2 and itl["server_p50"] == pytest.approx(275.0)
    assert "tpot_ms" not in lat and "e2el_ms" not in lat  # not exposed: not reported


def test_histogram_quantile_by_hand():
    from cbbench.analysis.server_side.server_latency import histogram_quantile, quantile_bucket

    inf = float("inf")
    # 10 observations: 2 <= 0.1, 8 more <= 0.2. p50 rank 5: 0.1 + 0.1 * (5 - 2) / 8.
    assert histogram_quantile(0.5, {0.1: 2, 0.2: 10, inf: 10}) == pytest.approx(0.1375)
    assert histogram_quantile(0.5, {0.1: 0, 0.2: 0, inf: 4}) == 0.2  # beyond the last bound
    assert histogram_quantile(0.1, {0.1: 4, inf: 4}) == pytest.approx(0.01)  # from 0: 0.1 * 0.4 / 4
    assert histogram_quantile(0.5, {0.1: 0, inf: 0}) is None
    assert quantile_bucket(0.5, {0.1: 2, 0.2: 10, inf: 10}) == (0.1, 0.2)
    assert quantile_bucket(0.5, {0.1: 0, 0.2: 0, inf: 4}) == (0.2, inf)


def test_scrape_keeps_llamacpp_sglang_and_tgi_names(notices):
    with FakeOpenAI(metrics_page=lambda fake: LLAMACPP_PAGE) as s:
        notes = notices  # the logged notices (conftest)
        run = run_http(endpoint_options(s.url, scrape_metrics=True), prompt_requests(["x"] * 2), [0.0, 0.3])
        names = {r["name"] for r in run.info["server_metrics"]}
        assert names == {
            "llamacpp:prompt_tokens_total", "llamacpp:requests_processing",
            "sglang:num_running_reqs", "tgi_queue_size",
        }
        assert not [n for n in notes if "metrics" in n] and "server_latency" not in run.info
        # A filter keeps what it finds instead.
        run = run_http(
            endpoint_options(s.url, scrape_metrics=True, scrape_metrics_filter=r"^process_|prompt_tokens_total$"),
            prompt_requests(["x"]), [0.0],
        )
        names = {r["name"] for r in run.info["server_metrics"]}
        assert names == {"process_open_fds", "llamacpp:prompt_tokens_total"}
        # A filter that finds nothing: one warning line, naming the filter.
        run = run_http(
            endpoint_options(s.url, scrape_metrics=True, scrape_metrics_filter="^nothing_here"),
            prompt_requests(["x"]), [0.0],
        )
    said = [n for n in notes if "metrics" in n]
    assert run.info["server_metrics"] == [] and len(said) == 1
    assert "no metric matched" in said[0] and "^nothing_here" in said[0]


def test_bad_scrape_filter_is_a_usage_error():
    with pytest.raises(UsageError, match="--scrape-metrics-filter"):
        EndpointOptions("http://h", scrape_metrics_filter="(unclosed").validate()


def test_diff_of_means_by_hand():
    """diff_mean = client mean - server mean, the server's from _sum/_count of the run's
    scrape difference. Hand-computed: the run adds 4 TTFTs summing 0.4 s (mean 100 ms) in the
    (50, 500] ms bucket, so the interpolated p50 is 275 ms; the client saw 110-140 ms."""
    from cbbench.analysis.records import RequestRecord
    from cbbench.analysis.server_side.server_latency import server_vs_client
    from cbbench.analysis.table import server_latency_table

    def page(n_low: int, n_mid: int, total_s: float) -> str:
        name = "vllm:time_to_first_token_seconds"
        return (
            f"# TYPE {name} histogram\n"
            f'{name}_bucket{{le="0.05"}} {n_low}\n'
            f'{name}_bucket{{le="0.5"}} {n_low + n_mid}\n'
            f'{name}_bucket{{le="+Inf"}} {n_low + n_mid}\n'
            f"{name}_sum {total_s}\n{name}_count {n_low + n_mid}\n"
        )

    before, after = page(2, 0, 0.01), page(2, 4, 0.41)  # 2 earlier requests (0.01 s)
    recs = [
        RequestRecord(id=i, prompt_tokens=1, output_tokens=1, intended_start_s=0.0, send_s=0.0,
                      token_times_s=[t])
        for i, t in enumerate([0.11, 0.12, 0.13, 0.14])
    ]
    ttft = server_vs_client(before, after, recs)["ttft_ms"]
    assert ttft["observations"] == 4
    assert ttft["server_mean"] == pytest.approx(100.0)
    assert ttft["client_mean"] == pytest.approx(125.0)
    assert ttft["diff_mean"] == pytest.approx(25.0)
    # The p50 difference says little here (275 ms is the bucket's middle): the means do.
    assert ttft["server_p50"] == pytest.approx(275.0) and ttft["client_p50"] == pytest.approx(125.0)
    assert ttft["diff_p50"] == pytest.approx(-150.0)
    table = server_latency_table({"server_latency": {"ttft_ms": ttft}})
    assert "diff of means" in table
    row = next(x for x in table.splitlines() if x.startswith("TTFT p50"))
    assert row.split()[-1] == "25.00"


@pytest.mark.parametrize("flags", [["--scrape-metrics"], ["--scrape-metrics-filter", "("]])
def test_scrape_flags_without_an_endpoint_are_refused(tmp_path, flags):
    """With the bundled engine there is no /metrics to read: the flags (even a bad regex) were
    silently ignored."""

    res = invoke_app(["run", "--engine", "sim", "--num-requests", "2", *flags,
                      "--output", str(tmp_path / "r.json")])
    assert res.exit_code == 2
    assert "needs --endpoint" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r.json").exists()
