"""A text-prompt workload's prompt_len with --tokenizer: the server's count, special tokens
included (vLLM's ``len(tokenizer(prompt).input_ids)``, load/prompts.py's length rule), for every
--api; the chat template's own count, which writes its BOS itself, counts it once. Against the
in-process `cbbench serve --engine sim` with the shared Llama-3.1 tokenizer (skipped where that
is not on the machine: it is never copied into the repo). Every network loop here is bounded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import LLAMA3_DIR_CANDIDATES, cli_in_process, run_spec, sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.load.chat_template import load_chat_template
from cbbench.load.prompts import load_tokenizer
from cbbench.server.app import ServeConfig

LLAMA3 = next((Path(d) for d in LLAMA3_DIR_CANDIDATES if (Path(d) / "tokenizer.json").is_file()),
              None)
BOS = 128000  # <|begin_of_text|>
PROMPTS = [
    "Tell me a story about a cat who lives on the moon.",
    "What is the capital of France? Answer briefly.",
    "Explain quantum computing in simple terms for a child.",
]
# Each prompt's tokens with the BOS, by the tokenizer: 13 + 1, 10 + 1, 11 + 1 (37 in all).
# Counted without it, the records said 13, 10, 11 (34) where the server said 14, 11, 12.
EXPECTED = [14, 11, 12]
LLAMA3_CHAT_ADDS = 9  # the Llama-3 template's header tokens around a user message, BOS aside


@pytest.fixture(scope="module")
def llama3_server():
    if LLAMA3 is None:
        pytest.skip("no Llama-3.1 tokenizer in shared/ on this machine")
    # As `cbbench serve --tokenizer DIR` configures it: the folder's chat template renders chats.
    cfg = ServeConfig(tokenizer=load_tokenizer(str(LLAMA3)),
                      chat_template=load_chat_template(str(LLAMA3)))
    run = start_server(lambda: build_serving_engine(sim_options()), cfg)
    yield run
    run.stop()


def _run(url: str, tmp_path: Path, api: str) -> dict:
    workload = tmp_path / "txt.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p, "output_len": 8}) + "\n"
                                for p in PROMPTS))
    out = tmp_path / f"{api}.json"
    res = cli_in_process(["run", "--endpoint", url, "--api", api, "--tokenizer", str(LLAMA3),
                          "--workload", str(workload), "--output", str(out), "--quiet"])
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


def test_the_hand_figures_are_the_tokenizer_s():
    if LLAMA3 is None:
        pytest.skip("no Llama-3.1 tokenizer in shared/ on this machine")
    tok = load_tokenizer(str(LLAMA3))
    with_bos = [tok.encode(p).ids for p in PROMPTS]  # add_special_tokens=True, as vLLM
    assert [len(ids) for ids in with_bos] == EXPECTED
    assert all(ids[0] == BOS and ids.count(BOS) == 1 for ids in with_bos)
    assert [len(tok.encode(p, add_special_tokens=False).ids) + 1 for p in PROMPTS] == EXPECTED


def test_completions_prompt_len_counts_the_bos_as_the_server_does(llama3_server, tmp_path):
    result = _run(llama3_server.url, tmp_path, "completions")
    reqs = sorted(result["requests"], key=lambda r: r["id"])
    assert [r["prompt_tokens"] for r in reqs] == EXPECTED
    assert [r["server_prompt_tokens"] for r in reqs] == EXPECTED
    assert result["summary"]["total_input_tokens"] == sum(EXPECTED) == 37
    mismatch = result["summary"]["http"]["prompt_tokens_mismatch"]
    assert (mismatch["mean_diff"], mismatch["max_abs_diff"]) == (0.0, 0.0)


def test_chat_counts_the_bos_once(llama3_server, tmp_path):
    """--api chat: prompt_len is the same text count (BOS included); the chat template's count
    renders the template, which writes <|begin_of_text|> itself, and encodes it without adding
    another: 9 tokens over prompt_len on Llama-3, not 10. The server renders the same template
    (as vLLM): its usage is that count."""
    from cbbench.load.chat_template import render_bounded

    result = _run(llama3_server.url, tmp_path, "chat")
    reqs = sorted(result["requests"], key=lambda r: r["id"])
    assert [r["prompt_tokens"] for r in reqs] == EXPECTED
    assert result["summary"]["total_input_tokens"] == sum(EXPECTED)
    tok = load_tokenizer(str(LLAMA3))
    template, bos, eos = load_chat_template(str(LLAMA3 / "tokenizer.json"))
    templated = []
    for p in PROMPTS:
        text = render_bounded(template, messages=[{"role": "user", "content": p}],
                              add_generation_prompt=True, bos_token=bos, eos_token=eos)
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids.count(BOS) == 1
        templated.append(len(ids))
    assert templated == [n + LLAMA3_CHAT_ADDS for n in EXPECTED]
    assert [r["prompt_token_counts"]["chat_template"] for r in reqs] == templated
    assert [r["server_prompt_tokens"] for r in reqs] == templated
    counts = result["summary"]["http"]["token_counts"]
    assert counts["chat_template_tokens_added_mean"] == LLAMA3_CHAT_ADDS


def test_a_session_turn_counts_its_content_alone(tmp_path):
    """Session messages keep the content-only count: the chat template adds the BOS and the
    headers around the whole conversation, once."""
    if LLAMA3 is None:
        pytest.skip("no Llama-3.1 tokenizer in shared/ on this machine")
    from cbbench.bench.runner import _load_workload
    from cbbench.targets.options import EndpointOptions

    path = tmp_path / "sess.jsonl"
    path.write_text(json.dumps({"turns": [{"user": p, "output_len": 4} for p in PROMPTS]}) + "\n")
    spec = run_spec(workload=str(path), endpoint=EndpointOptions(
        endpoint="http://127.0.0.1:9", api="chat", tokenizer=str(LLAMA3 / "tokenizer.json")))
    (session,) = _load_workload(spec, None).sessions
    assert [t.user_len for t in session.turns] == [n - 1 for n in EXPECTED]


@pytest.mark.skipif(LLAMA3 is None, reason="no Llama-3.1 tokenizer in shared/")
def test_a_prompt_no_longer_than_the_special_tokens_is_refused():
    """Ninth review: `--workload random --input-len 1 --tokenizer` (Llama-3.1) sent a word and
    the BOS, 2 tokens, while the records said 1. No text fits in a prompt the tokenizer's
    special tokens fill: refused with one line, as vLLM's random dataset refuses it."""
    from cbbench.errors import UsageError
    from cbbench.load.prompts import build_prompts
    from cbbench.load.workload_types import WorkloadRequest

    tok = load_tokenizer(str(LLAMA3))
    assert len(tok.encode(build_prompts([WorkloadRequest(0, 2, 4)], "chat", 0, tok)[0][0]).ids) == 2
    for api in ("completions", "chat"):
        with pytest.raises(UsageError, match="request 3: a 1-token prompt"):
            build_prompts([WorkloadRequest(3, 1, 4)], api, 0, tok)
