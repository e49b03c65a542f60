"""Speculative-decoding counters scraped from a fake server's /metrics into
summary.speculative (source "scraped"), vLLM's counters and SGLang's gauge (issue 24)."""

from __future__ import annotations

import json
import subprocess

import pytest
from fake_openai import MODEL, FakeOpenAI
from helpers import CBBENCH

from cbbench.analysis.speculative_scrape import scraped_speculative

# Earlier traffic, already counted when the run starts: the figures are the run's growth.
BEFORE = (1000, 3000, 1500)
PER_REQUEST = (10, 30, 21)  # drafts, draft tokens, accepted per request: 0.7 and 3.1


def vllm_spec_page(fake: FakeOpenAI) -> str:
    n = len(fake.requests)
    d, t, a = (b + n * p for b, p in zip(BEFORE, PER_REQUEST))
    m = f'{{model_name="{MODEL}"}}'
    return (
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        f"vllm:spec_decode_num_drafts_total{m} {d}\n"
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
        f"vllm:spec_decode_num_draft_tokens_total{m} {t}\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        f"vllm:spec_decode_num_accepted_tokens_total{m} {a}\n"
    )


def test_vllm_counters_give_acceptance_through_cbbench_run(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": "x", "output_len": 3}) + "\n" for _ in range(6)))
    with FakeOpenAI(metrics_page=vllm_spec_page) as s:
        out = subprocess.run(
            [*CBBENCH, "run", "--endpoint", s.url, "--served-model", MODEL, "--workload",
             str(wl), "--num-requests", "6", "--request-rate", "10", "--scrape-metrics",
             "--output", str(tmp_path / "r.json")],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr
    spec = json.loads((tmp_path / "r.json").read_text())["summary"]["speculative"]
    assert spec["source"] == "scraped" and spec["server"] == "vllm"
    assert spec["acceptance_rate"] == pytest.approx(21 / 30)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 21 / 10)
    served = spec["drafts"] / PER_REQUEST[0]
    assert served == int(served) and 1 <= served <= 6  # growth, not the counters' totals
    assert spec["accepted_tokens"] == served * PER_REQUEST[2]


def test_sglang_accept_length_and_nothing_to_report():
    rows = [{"t_s": t, "name": "sglang:spec_accept_length", "labels": {}, "value": v}
            for t, v in ((0.0, 2.0), (0.5, 3.0), (1.0, 4.0))]
    spec = scraped_speculative(rows)
    assert spec["server"] == "sglang" and spec["mean_acceptance_length"] == pytest.approx(3.0)
    assert spec["acceptance_rate"] is None
    assert scraped_speculative([{"t_s": 0.0, "name": "vllm:num_requests_running",
                                 "labels": {}, "value": 1}]) is None
    # A counter that went down (a restart mid-run) gives no figure.
    down = [{"t_s": t, "name": n, "labels": {}, "value": v} for t, v in ((0.0, 9), (1.0, 3))
            for n in ("vllm:spec_decode_num_draft_tokens_total",
                      "vllm:spec_decode_num_accepted_tokens_total")]
    assert scraped_speculative(down) is None
