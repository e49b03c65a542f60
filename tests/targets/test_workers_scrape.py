"""`--scrape-metrics` with `--workers`: the parent scrapes /metrics over the whole run, its
final scrape after the last request ended. It ran on worker 0 and stopped when worker 0's own
requests were done: with the last request on worker 1 (10 requests, the last of 1,000 output
tokens) the last scrape was at 0.50 s of a 4.69 s run and the server's histograms read 9 of
10 requests ("diff of means 417.83 ms" where the truth was ~3.5 ms)."""

from __future__ import annotations

import json

import pytest
from fake_openai import METRICS_PAGE, MODEL, FakeOpenAI, vllm_histograms_page
from helpers import invoke_app

N = 6
LAST_ARRIVAL_S = 1.2  # worker 1's last request, long after worker 0's three are done


@pytest.fixture(scope="module")
def server():
    def page(fake: FakeOpenAI) -> str:  # vLLM's gauges and counters, and its histograms
        return METRICS_PAGE.format(model=MODEL, running=fake.in_flight,
                                   prompt_tokens=fake.prompt_tokens) + vllm_histograms_page(fake)

    with FakeOpenAI(metrics_page=page) as s:
        yield s


def _workload(path):
    rows = [{"prompt": f"delay:0.01 s{i}", "output_len": 3, "arrival_s": 0.01 * i}
            for i in range(N - 1)]
    rows.append({"prompt": "delay:0.01 last", "output_len": 3, "arrival_s": LAST_ARRIVAL_S})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_final_scrape_comes_after_the_last_request_ended(server, tmp_path, workers):
    out = tmp_path / "r.json"
    res = invoke_app(["run", "--endpoint", server.url, "--workload",
                      str(_workload(tmp_path / "w.jsonl")), "--arrival", "trace",
                      "--workers", workers, "--scrape-metrics", "--save-detailed",
                      "--output", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    http = r["summary"]["http"]
    assert r["summary"]["completed"] == N
    assert [q["worker"] for q in r["requests"]][-1] == int(workers) - 1  # the last: worker 1
    last_end = max(q["intended_start_s"] + q["e2el_ms"] / 1000 for q in r["requests"])
    assert last_end > LAST_ARRIVAL_S
    rows = r["server_metrics"]
    scraped_at = max(row["t_s"] for row in rows)
    assert scraped_at >= last_end, (scraped_at, last_end)
    assert min(row["t_s"] for row in rows) >= 0  # from the run's start
    ttft = http["server_latency"]["ttft_ms"]
    assert ttft["observations"] == N  # every request, the last one's included
    assert http["server_metrics_scrapes"]["failed"] == 0
