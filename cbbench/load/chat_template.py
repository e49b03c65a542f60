"""Prompt tokens as a chat endpoint counts them: the chat template from the tokenizer_config.json
beside --tokenizer's tokenizer.json, rendered around each prompt as Hugging Face renders it
(a sandboxed Jinja environment with trim_blocks and lstrip_blocks), then tokenized. A chat
server adds these tokens (role headers, BOS, the generation prompt: 9 per request for Llama-3)
to every prompt; when it sends no usage, this is the client's best count of them. The
server's own template may differ (llama.cpp picks one from the GGUF, or by name), so the
result calls it `chat_template`, not `usage`.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from pathlib import Path

TOKENIZER_CONFIG = "tokenizer_config.json"
# Some list every added token (a few MB); far beyond that is not a tokenizer config.
TOKENIZER_CONFIG_MAX_BYTES = 64 << 20


def _special(config: dict, key: str) -> str:
    value = config.get(key) or ""
    return value.get("content", "") if isinstance(value, dict) else str(value)


def load_chat_template(tokenizer_path: str):
    """(compiled template, bos, eos) from the tokenizer_config.json beside the tokenizer, or
    None when there is none (or no chat_template in it, or it does not compile)."""
    path = Path(tokenizer_path).with_name(TOKENIZER_CONFIG)
    from cbbench.engine.json_file import read_json

    try:  # capped: a tokenizer_config.json linked to /dev/zero was read until the OOM killer
        config = read_json(path, "tokenizer config", TOKENIZER_CONFIG_MAX_BYTES)
    except ValueError:
        return None
    if not isinstance(config, dict):  # a list or a string: no template in it
        return None
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str):
        return None
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: _dt.datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    try:
        template = env.from_string(source)
    except TemplateError:
        return None
    return template, _special(config, "bos_token"), _special(config, "eos_token")


def chat_prompt_tokens(
    tokenizer_path: str, tokenizer, prompts: Sequence[str | list[int]]
) -> list[int | None] | None:
    """Per prompt, its token count inside the chat template (one user message and the
    generation prompt); None for the whole run without a usable template, or per prompt
    that is not text or does not render."""
    loaded = load_chat_template(tokenizer_path)
    if loaded is None:
        return None
    template, bos, eos = loaded
    from jinja2 import TemplateError

    out: list[int | None] = []
    for prompt in prompts:
        if not isinstance(prompt, str):
            out.append(None)
            continue
        try:
            text = template.render(
                messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
                bos_token=bos, eos_token=eos,
            )
        except TemplateError:
            out.append(None)
            continue
        # The template writes the special tokens itself (BOS included): none added here.
        out.append(len(tokenizer.encode(text, add_special_tokens=False).ids))
    return out
