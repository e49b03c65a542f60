"""A chat template that uses {% break %}, {% continue %} or {% generation %} renders as
Hugging Face's apply_chat_template renders it (transformers compiles templates with jinja's
loopcontrols and its own generation tag). Such a template did not compile here: the client
left those prompts uncounted and `cbbench serve --tokenizer` fell back to its minimal template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cbbench.load.chat_template import load_chat_template

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{% if loop.index > 3 %}{% break %}{% endif %}"
    "<{{ m['role'] }}>{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}"
    "{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "past the break"},
]


def test_loop_controls_and_the_generation_tag_render_as_transformers_does(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
    template = load_chat_template(str(tmp_path))
    assert template is not None  # it compiles
    ours = template.render(MESSAGES, add_generation_prompt=True)
    # By hand: the system message skipped, the loop broken at the 4th message.
    assert ours == "<s><user>hi<assistant>hello</s><assistant>"
    transformers = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = transformers.render_jinja_template(
        conversations=[MESSAGES], chat_template=TEMPLATE, add_generation_prompt=True,
        bos_token="<s>", eos_token="</s>")
    assert ours == rendered[0]


def test_a_chat_template_jinja_file_is_the_template_as_transformers_loads_it(tmp_path):
    """Ninth review: a model folder saved by transformers >= 4.43 keeps its template in
    chat_template.jinja (taking priority over tokenizer_config.json's); it was ignored: no
    chat-template count on the client, and `serve --tokenizer` rendered its minimal one."""
    from helpers import llama3_tokenizer_dir

    from cbbench.load.chat_template import chat_prompt_tokens
    from cbbench.load.prompts import load_tokenizer

    folder = llama3_tokenizer_dir()
    config = json.loads(Path(folder, "tokenizer_config.json").read_text())
    (tmp_path / "chat_template.jinja").write_text(config.pop("chat_template"))
    config["chat_template"] = "stale: {{ messages[0]['content'] }}"  # the file wins
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").symlink_to(f"{folder}/tokenizer.json")
    messages = [{"role": "user", "content": "The quick brown fox"}]
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want = list(want if isinstance(want, list) else want["input_ids"])
    tok = load_tokenizer(str(tmp_path))
    assert chat_prompt_tokens(str(tmp_path), tok, ["The quick brown fox"]) == [len(want)]
