"""Token-id workloads on --api chat: the text sent for the ids re-encodes to as many tokens as
there are ids, and requests that share their first ids share text that encodes to those same
first tokens (sixth review).

Random ids below 512 (random --prefix-len, shared-prefix, Mooncake's hash blocks) are Llama-3's
bytes and word pieces: decoded, they merge when encoded again, and 300 ids read back as
261-279 tokens (a random --input-len 200 --prefix-len 100 run had the server count 15.9 tokens
fewer than the workload, template included). Every expected count here is the tokenizer's own.
"""

from __future__ import annotations

import json

from helpers import llama3_tokenizer_dir, sim_options, start_server
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.load.prompts import build_prompts, load_tokenizer
from cbbench.load.synthetic import RandomSpec, random_workload
from cbbench.load.workload import load_workload
from cbbench.load.workload_types import WorkloadRequest

PREFIX_LEN = 100
INPUT_LEN = 200
N = 20


def _tok():
    return load_tokenizer(llama3_tokenizer_dir())


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def _shared_tokens(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_random_prefix_ids_become_text_of_their_length_with_the_prefix_shared():
    tok = _tok()
    reqs = random_workload(RandomSpec(INPUT_LEN, 10, 0.0, PREFIX_LEN), N, 0).requests
    prompts, kinds = build_prompts(reqs, "chat", 0, tok)
    assert kinds == {"decoded": N}
    encoded = [_ids(tok, str(p)) for p in prompts]
    # Exact: one token per id (before: 261-279 for 300 ids), but the last: the chat
    # template's BOS is one of prompt_len's tokens (the length rule; ninth review).
    assert [len(e) for e in encoded] == [PREFIX_LEN + INPUT_LEN - 1] * N
    # The shared prefix: the same text, the same 100 tokens, for every request.
    head = encoded[0][:PREFIX_LEN]
    assert all(e[:PREFIX_LEN] == head for e in encoded)
    prefix_text = tok.decode(head)
    assert all(str(p).startswith(prefix_text) for p in prompts)
    # Own ids differ, so the text does right after the prefix (the ids' sharing, no more:
    # the 20 requests' first own ids are not all one id).
    first_own = {r.prompt_token_ids[PREFIX_LEN] for r in reqs}
    assert len({e[PREFIX_LEN] for e in encoded}) == len(first_own) > 1
    # The same ids, the same text (on every target, every worker).
    assert build_prompts(reqs, "chat", 0, tok) == (prompts, kinds)


def test_shared_prefix_groups_keep_their_system_prompt_and_length():
    tok = _tok()
    w = load_workload("shared-prefix").requests
    group, other = w[:3], w[50]  # 50 requests a group, sharing its system prompt
    system = _shared_tokens(list(group[0].prompt_token_ids), list(group[1].prompt_token_ids))
    prompts, _ = build_prompts([*group, other], "chat", 0, tok)
    encoded = [_ids(tok, str(p)) for p in prompts]
    assert [len(e) for e in encoded] == [r.prompt_len - 1 for r in [*group, other]]  # + BOS
    assert _shared_tokens(encoded[0], encoded[1]) == system
    assert _shared_tokens(encoded[0], encoded[2]) == _shared_tokens(
        list(group[0].prompt_token_ids), list(group[2].prompt_token_ids))
    assert _shared_tokens(encoded[0], encoded[3]) == _shared_tokens(
        list(group[0].prompt_token_ids), list(other.prompt_token_ids))


def test_mooncake_blocks_share_their_text():
    tok = _tok()
    # Two prompts that share their first 512-token block, and a 100-token tail of their own.
    a = WorkloadRequest(0, 1124, 4, hash_ids=(7, 8))
    b = WorkloadRequest(1, 1124, 4, hash_ids=(7, 9))
    prompts, _ = build_prompts([a, b], "chat", 0, tok)
    ea, eb = (_ids(tok, str(p)) for p in prompts)
    assert len(ea) == len(eb) == 1123  # and the template's BOS
    assert _shared_tokens(ea, eb) == _shared_tokens(list(a.token_ids()), list(b.token_ids()))
    assert ea[:512] == eb[:512]


def test_ids_of_real_text_are_sent_as_that_text():
    tok = _tok()
    text = "Summarize the following report in three sentences, please."
    ids = tuple(_ids(tok, text))
    bos = tok.token_to_id("<|begin_of_text|>")
    reqs = [WorkloadRequest(0, len(ids), 4, prompt_token_ids=ids),
            WorkloadRequest(1, len(ids) + 1, 4, prompt_token_ids=(bos, *ids))]
    prompts, kinds = build_prompts(reqs, "chat", 0, tok)
    # The BOS is the chat template's to add: the text is the same.
    assert prompts == [text, text] and kinds == {"decoded": 2}


def test_a_chat_run_against_serve_counts_the_workloads_tokens(tmp_path):
    """The reviewer's run: random --input-len 200 --prefix-len 100 on --api chat against
    `serve --engine sim --tokenizer` (Llama-3.1). The server's count is the workload's 300
    plus its template around the message, the same for every request (before: 281-291,
    mean_diff -15.9), and equal to the client's own count with the tokenizer's chat template:
    the server renders that template too (seventh review: it rendered its minimal one)."""
    from cbbench.cli.serve import build_serving_engine
    from cbbench.load.chat_template import load_chat_template
    from cbbench.server.app import ServeConfig

    folder = llama3_tokenizer_dir()
    tok = load_tokenizer(folder)
    template = load_chat_template(folder)
    # The template's tokens around a one-token message, its BOS left out: the workload's
    # 300 count the BOS (the length rule), so the message is 299 tokens (ninth review).
    one = tok.encode(template.render([{"role": "user", "content": "the"}]),
                     add_special_tokens=False).ids
    overhead = len(one) - 2
    server = start_server(lambda: build_serving_engine(sim_options()),
                          ServeConfig(tokenizer=tok, chat_template=template))
    out = tmp_path / "r.json"
    try:
        r = CliRunner().invoke(app, [
            "run", "--endpoint", server.url, "--api", "chat", "--workload", "random",
            "--input-len", str(INPUT_LEN), "--output-len", "10", "--prefix-len", str(PREFIX_LEN),
            "--num-requests", str(N), "--request-rate", "inf", "--tokenizer", folder,
            "--save-detailed", "--output", str(out)])
    finally:
        server.stop()
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    reqs = d["requests"]
    assert len(reqs) == N and all(q["error"] is None for q in reqs)
    assert {q["prompt_tokens"] for q in reqs} == {PREFIX_LEN + INPUT_LEN}
    mismatch = d["summary"]["http"]["prompt_tokens_mismatch"]
    assert mismatch["requests"] == N
    assert mismatch["mean_diff"] == mismatch["max_abs_diff"] == overhead
    # The client's chat-template count is the server's usage, request by request.
    assert all(q["prompt_token_counts"]["chat_template"] == q["server_prompt_tokens"]
               for q in reqs)
    assert d["summary"]["http"]["token_counts"]["chat_template_tokens_added_mean"] == overhead


def test_a_session_turns_ids_become_text_of_their_length():
    """A multi-turn session's `user_token_ids` on chat: the same text rule as a request's."""
    import numpy as np
    from fake_openai import endpoint_options

    from cbbench.load.session_plan import SessionPlan
    from cbbench.load.sessions import Session, Turn
    from cbbench.targets.http_sessions import SessionDispatch

    tok = _tok()
    ids = tuple(np.random.default_rng(5).integers(0, 512, 300).tolist())
    assert len(_ids(tok, tok.decode(list(ids)))) != 300  # what the decoded text read back as
    plan = SessionPlan([Session(0, (Turn(300, 4, user_token_ids=ids),))], np.zeros(1))
    dispatch = SessionDispatch(endpoint_options("http://h:1", api="chat"), plan, tok)
    assert len(_ids(tok, dispatch.user_texts[0][0])) == 300
    assert dispatch.kinds == {"decoded": 1}


def test_random_prefix_chat_prompts_are_as_long_as_the_length_rule_says():
    """Ninth review: with --prefix-len, --api chat sent one token more than asked. The length
    rule (and vLLM's random dataset, which draws input_len - num_special_tokens_to_add()
    tokens of text for every endpoint) counts the BOS in prompt_len; the ids' words carried
    prompt_len tokens of text, so the chat template's BOS made it prompt_len + 1 (a Llama-3
    template's excess read 10 instead of the 9 of the same request without a prefix)."""
    from cbbench.load.chat_template import chat_prompt_tokens
    from cbbench.load.prompts import count_prompt_tokens

    tok = _tok()
    folder = llama3_tokenizer_dir()
    with_prefix = random_workload(RandomSpec(50, 4, 0.0, 20), 3, 0).requests
    without = random_workload(RandomSpec(70, 4, 0.0, 0), 3, 0).requests
    for reqs in (with_prefix, without):
        prompts, _ = build_prompts(reqs, "chat", 0, tok)
        assert [count_prompt_tokens(tok, str(p)) for p in prompts] == [70] * 3
        assert chat_prompt_tokens(folder, tok, prompts) == [79] * 3  # BOS + 69 + the template's 9
