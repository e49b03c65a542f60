"""Endpoints as people run them (issue 27, Build 7): --tokenizer FOLDER, prompts sized with the
server's /tokenize, --served-model from /v1/models, --lora-modules shares, several --endpoint
URLs with --balance. Against the fake server (tests/fake_openai.py, which has no /tokenize and
records every request body) and the in-process `cbbench serve --engine sim`."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from fake_openai import LLAMA3_TOKENIZER, MODEL, FakeOpenAI
from helpers import invoke_app, sim_options, start_server

from cbbench.errors import UsageError
from cbbench.options import EndpointFlags
from cbbench.targets.balance import Balancer, lora_models, parse_lora_modules

N = 40
LLAMA3_FOLDER = LLAMA3_TOKENIZER.parent
SPECIALS = ("<s>", "<x>", "<y>")  # three special tokens a plain encode adds (Llama-3 adds one)


def invoke(monkeypatch, *args: str):
    monkeypatch.setattr(sys, "argv", ["cbbench", *args])
    return invoke_app(list(args))


def one_error_line(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("cbbench: error: ") and "Traceback" not in res.output
    return lines[0]


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt_len": 12 + i % 7, "output_len": 4}) + "\n"
                            for i in range(N)))
    return path


def run(monkeypatch, url, workload, out, *extra):
    res = invoke(monkeypatch, "run", "--endpoint", url, "--workload", str(workload),
                 "--num-requests", str(N), "--request-rate", "inf", "--output", str(out),
                 "--quiet", *extra)
    return res, (json.loads(out.read_text()) if res.exit_code == 0 else None)


# ---- --tokenizer FOLDER ----------------------------------------------------------------------
def test_tokenizer_folder_is_its_tokenizer_json(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="without a tokenizer.json"):
        EndpointFlags(endpoint="http://h:1", tokenizer=str(tmp_path / "empty")).target(0)
    if not LLAMA3_TOKENIZER.is_file():
        pytest.skip("no Llama-3.1 tokenizer in ../shared on this machine")
    opts = EndpointFlags(endpoint="http://h:1", tokenizer=str(LLAMA3_FOLDER)).target(0)
    assert Path(opts.tokenizer) == LLAMA3_TOKENIZER


def test_tokenizer_folder_sizes_prompts_and_reads_its_chat_template(
        fresh_fake_server, workload, tmp_path, monkeypatch):
    if not LLAMA3_TOKENIZER.is_file():
        pytest.skip("no Llama-3.1 tokenizer in ../shared on this machine")
    from cbbench.load.prompts import load_tokenizer

    tok = load_tokenizer(str(LLAMA3_FOLDER))
    res, result = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "r.json",
                      "--tokenizer", str(LLAMA3_FOLDER), "--api", "chat")
    assert res.exit_code == 0, res.output
    http = result["summary"]["http"]
    assert http["prompt_kinds"] == {"synthetic_exact": N} and http["prompt_sizing"] == "tokenizer"
    sent = [r["body"]["messages"][0]["content"] for r in fresh_fake_server.requests]
    want = sorted(12 + i % 7 for i in range(N))
    assert sorted(len(tok.encode(t).ids) for t in sent) == want  # exact, BOS included
    # The folder's tokenizer_config.json gave the chat template (Llama-3's adds its headers).
    assert all(r["prompt_token_counts"]["chat_template"] > r["prompt_tokens"]
               for r in result["requests"])


# ---- /tokenize sizing ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizing_server(tmp_path_factory):
    """`cbbench serve --engine sim` with a word-level tokenizer that adds three special tokens,
    so the approximate prompts (one BOS assumed) are two tokens long each."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from cbbench.cli.serve import build_serving_engine
    from cbbench.load.prompts import WORD_POOL, load_tokenizer
    from cbbench.server.app import ServeConfig

    vocab = {"[UNK]": 0, **{s: i + 1 for i, s in enumerate(SPECIALS)},
             **{w: i + 4 for i, w in enumerate(WORD_POOL)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single=" ".join(SPECIALS) + " $A", special_tokens=[(s, vocab[s]) for s in SPECIALS])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    srv = start_server(lambda: build_serving_engine(sim_options()),
                       ServeConfig(tokenizer=load_tokenizer(str(path))))
    yield srv
    srv.stop()


def test_prompts_are_sized_with_the_servers_tokenize(
        tokenizing_server, fresh_fake_server, workload, tmp_path, monkeypatch):
    res, result = run(monkeypatch, tokenizing_server.url, workload, tmp_path / "s.json")
    assert res.exit_code == 0, res.output
    http = result["summary"]["http"]
    assert http["prompt_sizing"] == "server_tokenize"
    assert http["prompt_kinds"] == {"synthetic_server": N}
    assert http["token_counts"]["workload_counted_by"] == "server /tokenize"
    reqs = result["requests"]
    assert len(reqs) == N and all(r["server_prompt_tokens"] == r["prompt_tokens"] for r in reqs)
    # The check can fail: the fake has no /tokenize, so the same prompts stay approximate, and
    # on the tokenizing server those are two tokens long each (three specials, not one BOS).
    res, fake = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "f.json")
    assert res.exit_code == 0, res.output
    assert fake["summary"]["http"]["prompt_sizing"] == "approximate"
    assert fake["summary"]["http"]["prompt_kinds"] == {"synthetic_approx": N}
    texts = [r["body"]["prompt"] for r in fresh_fake_server.requests]
    lens = sorted(len(t.split()) + len(SPECIALS) for t in texts)
    assert lens == sorted(12 + i % 7 + 2 for i in range(N))


# ---- --served-model from /v1/models ----------------------------------------------------------
def test_served_model_is_the_servers_only_model(fresh_fake_server, workload, tmp_path,
                                                monkeypatch):
    res, result = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "a.json")
    assert res.exit_code == 0 and result["config"]["served_model"] == MODEL
    assert {r["model"] for r in result["requests"]} == {MODEL}
    # vLLM lists LoRA adapters beside the base, each with its parent: the base is chosen.
    fresh_fake_server.models = [{"id": "base-m", "parent": None},
                                {"id": "sql", "parent": "base-m"}]
    res, result = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "b.json")
    assert res.exit_code == 0 and result["config"]["served_model"] == "base-m"
    fresh_fake_server.models = [{"id": "m1"}, {"id": "m2"}]
    before = len(fresh_fake_server.requests)
    res, _ = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "c.json")
    line = one_error_line(res)
    assert "serves 2 models (m1, m2)" in line and "--served-model" in line
    assert len(fresh_fake_server.requests) == before  # nothing was sent
    res, result = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "d.json",
                      "--served-model", "m2")
    assert res.exit_code == 0 and {r["body"]["model"] for r in
                                   fresh_fake_server.requests[before:]} == {"m2"}


# ---- --lora-modules --------------------------------------------------------------------------
def test_lora_modules_send_each_share_to_its_adapter(fresh_fake_server, workload, tmp_path,
                                                     monkeypatch):
    res, result = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "l.json",
                      "--lora-modules", "sql=0.5,chat=0.25", "--seed", "3")
    assert res.exit_code == 0, res.output
    asked = Counter(r["body"]["model"] for r in fresh_fake_server.requests)
    recorded = Counter(r["model"] for r in result["requests"])
    assert asked == recorded and set(asked) == {"sql", "chat", MODEL}  # the rest: the base
    want = Counter(lora_models(range(N), {"sql": 0.5, "chat": 0.25}, 3, MODEL))
    assert recorded == want  # seeded, per request id
    by_model = result["summary"]["by_model"]
    assert {k: v["completed"] for k, v in by_model.items()} == dict(want)
    assert sum(v["completed"] for v in by_model.values()) == result["summary"]["completed"]
    # The same seed sends the same requests to the same adapters.
    fresh_fake_server.reset()
    res, again = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "l2.json",
                     "--lora-modules", "sql=0.5,chat=0.25", "--seed", "3")
    assert [r["model"] for r in again["requests"]] == [r["model"] for r in result["requests"]]


def test_lora_shares_follow_their_probabilities():
    got = Counter(lora_models(range(20000), {"a": 0.5, "b": 0.3}, 0, "base"))
    assert abs(got["a"] / 20000 - 0.5) < 0.015 and abs(got["b"] / 20000 - 0.3) < 0.015
    assert parse_lora_modules("a=0.5,b=0.5") == {"a": 0.5, "b": 0.5}


@pytest.mark.parametrize("bad,says", [
    ("a", "invalid --lora-modules 'a'"),
    ("a=2", "invalid --lora-modules 'a=2'"),
    ("a=0", "invalid --lora-modules 'a=0'"),
    ("a=x", "invalid --lora-modules 'a=x'"),
    ("a=0.6,b=0.6", "sum to 1.2, above 1"),
    ("a=0.2,a=0.2", "names 'a' twice"),
])
def test_bad_lora_modules_are_one_line(bad, says, fresh_fake_server, workload, tmp_path,
                                       monkeypatch):
    res, _ = run(monkeypatch, fresh_fake_server.url, workload, tmp_path / "x.json",
                 "--lora-modules", bad)
    assert says in one_error_line(res)


# ---- several --endpoint URLs -----------------------------------------------------------------
def test_round_robin_splits_requests_and_the_summary_by_url(fresh_fake_server, workload,
                                                            tmp_path, monkeypatch):
    with FakeOpenAI() as other:
        urls = f"{fresh_fake_server.url},{other.url}"
        res, result = run(monkeypatch, urls, workload, tmp_path / "rr.json")
        assert res.exit_code == 0, res.output
        assert len(fresh_fake_server.requests) == len(other.requests) == N // 2
        per_url = Counter(r["endpoint"] for r in result["requests"])
        assert per_url == {fresh_fake_server.url: N // 2, other.url: N // 2}
        by = result["summary"]["by_endpoint"]
        assert {k: v["completed"] for k, v in by.items()} == dict(per_url)
        assert result["summary"]["http"]["sent_by_endpoint"] == dict(per_url)
        assert result["config"]["endpoints"] == [fresh_fake_server.url, other.url]
        fresh_fake_server.reset()
        res, least = run(monkeypatch, urls, workload, tmp_path / "lif.json",
                         "--balance", "least-in-flight")
        assert res.exit_code == 0, res.output
        sent = Counter(r["endpoint"] for r in least["requests"])
        assert sum(sent.values()) == N and sent[fresh_fake_server.url] == len(
            fresh_fake_server.requests)


def test_least_in_flight_picks_the_emptiest_endpoint():
    b = Balancer(["A", "B", "C"], ["a", "b", "c"], "least-in-flight")
    assert [b.acquire() for _ in range(3)] == [0, 1, 2]  # ties: the lowest index
    b.release(1)
    assert b.acquire() == 1  # B was the only one with none in flight
    b.release(2)
    assert b.acquire() == 2 and b.in_flight == [1, 1, 1]
    rr = Balancer(["A", "B"], ["a", "b"], "round-robin")
    assert [rr.acquire() for _ in range(5)] == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("extra,says", [
    (("--balance", "random"), "--balance must be one of round-robin, least-in-flight"),
    (("--scrape-metrics",), "give one --endpoint"),
])
def test_bad_balance_values_are_one_line(extra, says, fresh_fake_server, workload, tmp_path,
                                         monkeypatch):
    res, _ = run(monkeypatch, f"{fresh_fake_server.url},http://127.0.0.1:9", workload,
                 tmp_path / "x.json", *extra)
    assert says in one_error_line(res)


def test_bad_endpoint_lists_are_one_line(fresh_fake_server, workload, tmp_path, monkeypatch):
    u = fresh_fake_server.url
    res, _ = run(monkeypatch, f"{u},{u}/v1", workload, tmp_path / "x.json")
    assert "names one URL twice" in one_error_line(res)
    res, _ = run(monkeypatch, f"{u},ftp://x", workload, tmp_path / "y.json")
    assert "invalid --endpoint 'ftp://x'" in one_error_line(res)
