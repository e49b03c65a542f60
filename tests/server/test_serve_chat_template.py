"""`cbbench serve --tokenizer DIR` renders chats with the tokenizer's own chat template, as
vLLM does: its prompt tokens (usage, /tokenize) are Hugging Face's
``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`` ids, the BOS
written once by the template. Before, the server rendered its minimal ``<|role|>`` template
for every model and counted a multi-turn Llama-3 chat 2 tokens per message off vLLM's.

The truth is transformers itself over the shared Llama-3.1 tokenizer folder (skipped where
either is absent; the folder is never copied into the repo). Every network loop is bounded.
"""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
from helpers import SERVE_MODEL, llama3_tokenizer_dir, serve_process, sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.load.chat_template import load_chat_template
from cbbench.load.prompts import load_tokenizer
from cbbench.server.app import ServeConfig
from cbbench.server.protocol import APIError, ChatMessage, render_chat
from cbbench.server.text import make_codec

BOS = 128000  # <|begin_of_text|>
HTTP_TIMEOUT_S = 30.0
SINGLE = [{"role": "user", "content": "Hello, world! The quick brown fox jumps over the dog."}]
MULTI = [
    {"role": "system", "content": "You are a terse assistant. ünïcödé ✓"},
    {"role": "user", "content": "Hi there, who are you?"},
    {"role": "assistant", "content": "A helper that answers in few words."},
    {"role": "user", "content": "Tell me more about the moon."},
]
CHATS = {"single": SINGLE, "multi": MULTI}


@pytest.fixture(scope="module")
def folder() -> str:
    return llama3_tokenizer_dir()


@pytest.fixture(scope="module")
def hf(folder):
    """transformers' tokenizer for the same folder: the truth vLLM renders with."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(folder)


def hf_ids(hf, messages: list[dict], **kw) -> list[int]:
    out = hf.apply_chat_template(messages, tokenize=True, **kw)
    return list(out if isinstance(out, list) else out["input_ids"])  # v5: a BatchEncoding


@pytest.fixture(scope="module")
def server(folder):
    """As `cbbench serve --tokenizer DIR` configures it (cli/serve.py)."""
    cfg = ServeConfig(tokenizer=load_tokenizer(folder), chat_template=load_chat_template(folder))
    run = start_server(lambda: build_serving_engine(sim_options()), cfg)
    with httpx.Client(base_url=run.url, timeout=HTTP_TIMEOUT_S) as c:
        yield c
    run.stop()


@pytest.mark.parametrize("chat", CHATS)
def test_chat_usage_and_tokenize_are_hugging_faces_template_ids(server, hf, chat):
    messages = CHATS[chat]
    want = hf_ids(hf, messages, add_generation_prompt=True)
    assert want[0] == BOS and want.count(BOS) == 1  # the template writes it, once
    tok = server.post("/tokenize", json={"messages": messages}).json()
    assert tok["tokens"] == want and tok["count"] == len(want)
    body = server.post("/v1/chat/completions",
                       json={"messages": messages, "max_tokens": 1}).json()
    assert body["usage"]["prompt_tokens"] == len(want)


def test_the_other_chat_apis_render_the_same_template(server, hf):
    """/v1/responses (instructions as the system message) and /v1/messages (Anthropic's
    system) render the conversation as chat does: the same count."""
    want = len(hf_ids(hf, MULTI, add_generation_prompt=True))
    system, turns = MULTI[0]["content"], MULTI[1:]
    r = server.post("/v1/responses", json={"input": turns, "instructions": system,
                                           "max_output_tokens": 1, "store": False}).json()
    assert r["usage"]["input_tokens"] == want
    m = server.post("/v1/messages", json={"model": SERVE_MODEL, "max_tokens": 1,
                                          "system": system, "messages": turns}).json()
    assert m["usage"]["input_tokens"] == want


def test_tokenize_follows_add_generation_prompt_and_continue_final_message(server, hf):
    bare = server.post("/tokenize", json={"messages": MULTI, "add_generation_prompt": False})
    assert bare.json()["tokens"] == hf_ids(hf, MULTI, add_generation_prompt=False)
    # An assistant turn to continue: the prompt ends inside it (no end-of-turn token).
    partial = [*MULTI[:3], {"role": "assistant", "content": "The moon is"}]
    r = server.post("/tokenize", json={"messages": partial, "add_generation_prompt": False,
                                       "continue_final_message": True})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == hf_ids(hf, partial, continue_final_message=True)
    # vLLM's rule: not both.
    both = server.post("/tokenize", json={"messages": partial, "continue_final_message": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    # add_special_tokens asked for: a second BOS, as vLLM adds it.
    twice = server.post("/tokenize", json={"messages": SINGLE, "add_special_tokens": True})
    assert twice.json()["tokens"][:2] == [BOS, BOS]


def test_cbbench_serve_tokenizer_folder_renders_its_template(folder, hf):
    """The command itself: `cbbench serve --tokenizer DIR` loads the folder's template."""
    want = len(hf_ids(hf, MULTI, add_generation_prompt=True))
    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200",
                       "--tokenizer", folder) as run:
        body = httpx.post(f"{run.url}/v1/chat/completions", timeout=HTTP_TIMEOUT_S,
                          json={"messages": MULTI, "max_tokens": 1}).json()
    assert body["usage"]["prompt_tokens"] == want


# ---- without a template: the minimal one -------------------------------------------------------
def test_a_tokenizer_without_a_template_keeps_the_minimal_one(folder, tmp_path):
    """A tokenizer.json alone (no tokenizer_config.json beside it): the minimal template, its
    text encoded with the tokenizer's BOS, as before."""
    from cbbench.server.chat_render import MINIMAL_TEMPLATE, ChatRenderer

    alone = tmp_path / "tokenizer.json"
    shutil.copy(f"{folder}/tokenizer.json", alone)
    assert load_chat_template(str(alone)) is None
    tok = load_tokenizer(str(alone))
    renderer = ChatRenderer(load_chat_template(str(alone)))
    msgs = [ChatMessage(**m) for m in MULTI]
    assert renderer.kind == MINIMAL_TEMPLATE
    assert renderer.encode(make_codec(tok, 0), msgs) == tok.encode(render_chat(msgs)).ids
    with pytest.raises(APIError) as e:  # the minimal template has nothing to continue in
        renderer.render(msgs, add_generation_prompt=False, continue_final_message=True)
    assert e.value.status == 400


def test_a_template_that_refuses_the_messages_is_a_400(tmp_path):
    """The template's own raise_exception (a role it does not take): vLLM's 400 with its
    message, not a 500 or a silent fallback."""
    from fake_openai import make_tiny_tokenizer

    path = make_tiny_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>",
        "chat_template": "{% for m in messages %}{% if m['role'] == 'system' %}"
                         "{{ raise_exception('System role not supported') }}{% endif %}"
                         "{{ m['content'] }} {% endfor %}",
    }))
    cfg = ServeConfig(tokenizer=load_tokenizer(path), chat_template=load_chat_template(path))
    run = start_server(lambda: build_serving_engine(sim_options()), cfg)
    try:
        with httpx.Client(base_url=run.url, timeout=HTTP_TIMEOUT_S) as c:
            r = c.post("/v1/chat/completions", json={"messages": MULTI, "max_tokens": 1})
            ok = c.post("/tokenize", json={"messages": MULTI[1:2], "add_generation_prompt": False})
    finally:
        run.stop()
    assert r.status_code == 400 and "System role not supported" in r.json()["error"]["message"]
    assert ok.status_code == 200 and ok.json()["count"] == 5  # its words: no BOS added


def test_the_renderer_names_its_template(folder):
    from cbbench.server.chat_render import TOKENIZER_TEMPLATE, ChatRenderer

    assert ChatRenderer(load_chat_template(folder)).kind == TOKENIZER_TEMPLATE


def test_messages_reach_the_template_as_vllm_hands_them_over(tmp_path):
    """Text parts joined with a newline, an earlier call's arguments as their JSON object,
    the chat request's tools as ``tools`` (vLLM's chat_utils)."""
    from cbbench.server.chat_render import ChatRenderer
    from cbbench.server.protocol import ChatRequest

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}[{{ m['role'] }}:{{ m['content'] }}"
        "{% for c in m.get('tool_calls') or [] %}"
        "|{{ c['function']['name'] }}={{ c['function']['arguments']['city'] }}{% endfor %}]"
        "{% endfor %}{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}"
    )}))
    req = ChatRequest.model_validate({
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "1", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        ],
        "tools": [{"type": "function", "function": {"name": "weather"}}],
    })
    renderer = ChatRenderer(load_chat_template(str(tmp_path)))
    prompt = renderer.render(req.messages, tools=req.tools)
    assert prompt.text == "[user:a\nb][assistant:|weather=Oslo]weather"
    assert prompt.add_special_tokens is False
