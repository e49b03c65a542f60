"""Speculative-decoding counters scraped from a fake server's /metrics into
summary.speculative (source "scraped"), vLLM's counters and SGLang's gauge (issue 24). `cbbench
run` is the console script's entry in this process (helpers.cli_in_process); the truth server
is a real `cbbench serve` process."""

from __future__ import annotations

import json

import pytest
from fake_openai import MODEL, FakeOpenAI
from helpers import cli_in_process

from cbbench.analysis.server_side.speculative_scrape import scraped_speculative

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
        out = cli_in_process(
            ["run", "--endpoint", s.url, "--served-model", MODEL, "--workload",
             str(wl), "--num-requests", "6", "--request-rate", "10", "--scrape-metrics",
             "--output", str(tmp_path / "r.json")],
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


def test_sglang_zero_accept_length_is_no_speculation():
    """SGLang exports sglang:spec_accept_length on every server and sets it to 0 when it does
    not speculate (and holds its SchedulerStats default, 0.0, until the first decode log
    window): an accept length counts the bonus token, so it is >= 1 whenever it measured
    anything. A non-speculating server is no summary.speculative; a speculating one's early
    zeros do not drag its mean down (2, 4 read with two zeros before them: 3, not 1.5)."""
    def rows(values):
        return [{"t_s": 0.5 * i, "name": "sglang:spec_accept_length", "labels": {}, "value": v}
                for i, v in enumerate(values)]

    assert scraped_speculative(rows([0.0, 0.0, 0.0])) is None
    spec = scraped_speculative(rows([0.0, 0.0, 2.0, 4.0]))
    assert spec["mean_acceptance_length"] == pytest.approx(3.0) and spec["scrapes"] == 2


def test_counters_across_a_restart_grow_as_prometheus_increase_counts():
    """drafts / draft tokens / accepted: 100/300/270 -> 150/450/405 -> a restart (0/0/0) ->
    1000/3000/1500. increase(), reset-aware over every scrape: 50 + 0 + 1000 = 1050 drafts,
    150 + 3000 = 3150 draft tokens, 135 + 1500 = 1635 accepted: acceptance 1635 / 3150 =
    0.519, mean length 1 + 1635 / 1050. First against last scrape gave 0.456 (1230 / 2700)."""
    names = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total")
    scrapes = [(0.0, (100, 300, 270)), (0.5, (150, 450, 405)), (1.0, (0, 0, 0)),
               (1.5, (1000, 3000, 1500))]
    rows = [{"t_s": t, "name": n, "labels": {"engine": "0"}, "value": v}
            for t, values in scrapes for n, v in zip(names, values)]
    spec = scraped_speculative(rows)
    assert (spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]) == (1050, 3150, 1635)
    assert spec["acceptance_rate"] == pytest.approx(1635 / 3150)
    assert round(spec["acceptance_rate"], 3) == 0.519
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 1635 / 1050)
    # Per label set: engine 1 (no restart) adds its own growth, not a fall of the sum.
    rows += [{"t_s": t, "name": n, "labels": {"engine": "1"}, "value": v}
             for t, values in ((0.0, (10, 30, 20)), (1.5, (20, 60, 40))) for n, v in zip(names, values)]
    spec = scraped_speculative(rows)
    assert (spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]) == (1060, 3180, 1655)


def _spec_counters(url: str) -> dict[str, float]:
    """The truth server's own spec_decode counters (the engine's iteration records, summed)."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name.startswith("vllm:spec_decode_"):
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_truth_server_spec_counters_scraped_end_to_end(tmp_path):
    """`cbbench serve --engine sim --speculative-tokens 3 --acceptance-rate 0.7` exports
    vLLM's counters; `cbbench run --endpoint` scrapes them into summary.speculative, equal to
    what the server counted; and the figures are the simulator's arithmetic (K=3, A=0.7:
    accepted/draft = (0.7 + 0.49 + 0.343) / 3 = 0.511, mean length 2.533)."""
    from helpers import serve_process

    with serve_process("--engine", "sim", "--model", "llama-3.2-1b", "--gpu", "h200",
                       "--speculative-tokens", "3", "--acceptance-rate", "0.7") as srv:
        assert _spec_counters(srv.url) == {  # registered at start, as vLLM does
            "vllm:spec_decode_num_drafts_total": 0.0,
            "vllm:spec_decode_num_draft_tokens_total": 0.0,
            "vllm:spec_decode_num_accepted_tokens_total": 0.0}
        out = cli_in_process(
            ["run", "--endpoint", srv.url, "--workload", "random", "--input-len",
             "64", "--output-len", "200", "--num-requests", "16", "--request-rate", "20",
             "--scrape-metrics", "--output", str(tmp_path / "r.json")])
        assert out.returncode == 0, out.stdout + out.stderr
        server = _spec_counters(srv.url)
    spec = json.loads((tmp_path / "r.json").read_text())["summary"]["speculative"]
    assert spec["source"] == "scraped" and spec["server"] == "vllm"
    assert spec["drafts"] == server["vllm:spec_decode_num_drafts_total"] > 0
    assert spec["draft_tokens"] == server["vllm:spec_decode_num_draft_tokens_total"]
    assert spec["accepted_tokens"] == server["vllm:spec_decode_num_accepted_tokens_total"]
    # A draft proposes K tokens, fewer near a request's max_tokens (no draft past the end).
    assert 2.9 * spec["drafts"] <= spec["draft_tokens"] <= 3 * spec["drafts"]
    # ~1,200 drafts: the figures' standard errors are ~0.01 and ~0.03; the few short drafts
    # (their early positions accept more often) lift the rate a little.
    assert spec["acceptance_rate"] == pytest.approx(1.533 / 3, abs=0.05)
    assert spec["mean_acceptance_length"] == pytest.approx(2.533, abs=0.15)


def test_no_spec_counters_without_speculation(sim_serve_process):
    assert _spec_counters(sim_serve_process.url) == {}
