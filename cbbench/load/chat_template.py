"""Prompt tokens as a chat endpoint counts them: the chat template from the tokenizer_config.json
beside --tokenizer's tokenizer.json, rendered around each prompt as Hugging Face renders it
(a sandboxed Jinja environment with trim_blocks and lstrip_blocks), then tokenized. A chat
server adds these tokens (role headers, BOS, the generation prompt: 9 per request for Llama-3)
to every prompt; when it sends no usage, this is the client's best count of them. The
server's own template may differ (llama.cpp picks one from the GGUF, or by name), so the
result calls it `chat_template`, not `usage`. `cbbench serve --tokenizer` renders its chats
with this same loader (server/chat_render.py), so its usage and this count agree.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

TOKENIZER_CONFIG = "tokenizer_config.json"
# Where transformers (>= 4.43) saves a folder's template; beside the config, it wins over the
# config's chat_template, as AutoTokenizer.from_pretrained loads it.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# Some list every added token (a few MB); far beyond that is not a tokenizer config.
TOKENIZER_CONFIG_MAX_BYTES = 64 << 20
# A template comes from a --tokenizer folder, which may be anyone's: its render is bounded
# (issue 37: `{{1/0}}`, type errors and recursion were tracebacks, nested loops hung). A real
# chat template renders one message in well under a millisecond, into a few hundred chars.
RENDER_TIME_LIMIT_S = 1.0  # per prompt, checked at every call, range() and lookup
RENDER_MAX_CHARS = 1 << 22  # the rendered prompt, and any string or list it builds
MAX_RANGE_ITEMS = 1 << 20  # items every range() of one render may make together
MAX_POWER_EXPONENT = 64


# Hugging Face's continue_final_message marker (transformers' render_jinja_template): written
# after the final message's text, then the render is cut where it appears, so the prompt ends
# inside that message (no end-of-turn token), whatever the template writes around it.
CONTINUE_FINAL_MESSAGE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class RenderLimit(Exception):
    """A template went past its render's time or size limit."""


class ChatTemplateError(Exception):
    """A chat could not be rendered: the template's own raise_exception, an error it ran into,
    a render limit, or a final message it does not write (continue_final_message). The
    message says which; a server answers it as a 400, as vLLM does."""


class ChatTemplate(NamedTuple):
    """A tokenizer folder's compiled chat template, with the special tokens it is given."""

    template: Any  # a jinja2 Template from the bounded sandbox below
    bos_token: str
    eos_token: str

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               continue_final_message: bool = False, tools: list[dict] | None = None) -> str:
        """The prompt text as Hugging Face's apply_chat_template(tokenize=False) renders it:
        the template writes every special token (BOS included), so whoever encodes it adds
        none (vLLM's rule). ``continue_final_message``: the text ends inside the last
        message, so the model continues it (Hugging Face's tag-and-cut). ChatTemplateError
        when it does not render."""
        final = ""
        if continue_final_message:
            if not messages or not isinstance(messages[-1].get("content"), str):
                raise ChatTemplateError("continue_final_message needs a final message with text")
            final = messages[-1]["content"]
            tagged = {**messages[-1], "content": final + CONTINUE_FINAL_MESSAGE_TAG}
            messages = [*messages[:-1], tagged]
        # tools and documents passed as None, as Hugging Face passes them: a template's
        # `tools is not none` is true of a name left undefined.
        text = render_checked(
            self.template, messages=messages, tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token, eos_token=self.eos_token,
        )
        if not continue_final_message:
            return text
        tag = CONTINUE_FINAL_MESSAGE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise ChatTemplateError("continue_final_message: the chat template does not write "
                                    "the final message as it was sent")
        at = text.rindex(tag)
        # A template that trims the content trimmed the tag's space too: trim what is left.
        return text[:at] if text.startswith(CONTINUE_FINAL_MESSAGE_TAG, at) else text[:at].rstrip()


def _special(config: dict, key: str) -> str:
    value = config.get(key) or ""
    return value.get("content", "") if isinstance(value, dict) else str(value)


def load_chat_template(tokenizer_path: str) -> ChatTemplate | None:
    """The chat template (with its bos and eos) from the tokenizer_config.json beside the
    tokenizer (or in the model folder given), its chat_template.jinja beside it first, or
    None when there is none (or no template, or it does not compile)."""
    given = Path(tokenizer_path)
    path = given / TOKENIZER_CONFIG if given.is_dir() else given.with_name(TOKENIZER_CONFIG)
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
    try:  # capped as the config is
        with open(path.with_name(CHAT_TEMPLATE_FILE), "rb") as f:
            raw = f.read(TOKENIZER_CONFIG_MAX_BYTES + 1)
        if len(raw) <= TOKENIZER_CONFIG_MAX_BYTES:
            source = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        pass  # none there (or unreadable): the config's
    if not isinstance(source, str):
        return None
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None

    def raise_exception(message):
        raise TemplateError(message)

    # The extensions transformers' apply_chat_template renders with: {% break %} and
    # {% continue %} (jinja's loopcontrols), and {% generation %} (below). A template using
    # either did not compile here, so its prompts went uncounted and serve fell back to the
    # minimal template.
    env = _bounded_sandbox(ImmutableSandboxedEnvironment)(
        trim_blocks=True, lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: _dt.datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    try:
        template = env.from_string(source)
    except Exception:  # a syntax error, or source nested past the parser's recursion
        return None
    return ChatTemplate(template, _special(config, "bos_token"), _special(config, "eos_token"))


def _generation_tag() -> type:
    """transformers' ``{% generation %}...{% endgeneration %}``: it marks the assistant's
    tokens for return_assistant_tokens_mask; for the prompt's text it writes its body as is."""
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return GenerationTag


def _bounded_sandbox(base: type) -> Callable[..., Any]:
    """Jinja's immutable sandbox with a budget per render (``env.start()`` opens one): a
    deadline checked at every call, attribute or item lookup and range(); range() items
    counted across the render; ``*`` and ``**`` refused past the size limits."""
    import time

    class BoundedSandbox(base):
        intercepted_binops = frozenset(["*", "**"])

        def start(self) -> None:
            self.deadline = time.monotonic() + RENDER_TIME_LIMIT_S
            self.range_items = 0

        def tick(self) -> None:
            if time.monotonic() > getattr(self, "deadline", float("inf")):
                raise RenderLimit(f"the template ran past {RENDER_TIME_LIMIT_S:g} s")

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
            __self.tick()
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj, attribute):
            self.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            self.tick()
            return super().getitem(obj, argument)

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > MAX_POWER_EXPONENT:
                raise RenderLimit(f"a power above {MAX_POWER_EXPONENT}")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                            and len(seq) * n > RENDER_MAX_CHARS:
                        raise RenderLimit(f"a sequence longer than {RENDER_MAX_CHARS}")
            return super().call_binop(context, operator, left, right)

    def bounded_range(*args):
        env = bounded_range.env
        env.tick()
        r = range(*args)
        env.range_items += len(r)
        if env.range_items > MAX_RANGE_ITEMS:
            raise RenderLimit(f"range() past {MAX_RANGE_ITEMS} items in one render")
        return r

    def make(*a, **kw):
        env = BoundedSandbox(*a, **kw)
        bounded_range.env = env
        env.globals["range"] = bounded_range
        env.start()
        return env

    return make


def render_checked(template, **context) -> str:
    """The template rendered within its limits; ChatTemplateError, with the reason, when it
    fails in any way (an error of its own, a type error, recursion, a limit)."""
    env = template.environment
    env.start()
    out: list[str] = []
    size = 0
    try:
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > RENDER_MAX_CHARS:
                raise RenderLimit(f"a rendered prompt longer than {RENDER_MAX_CHARS} characters")
            env.tick()
            out.append(chunk)
    except Exception as e:  # anything a hostile template raises (RecursionError too)
        raise ChatTemplateError(f"the chat template did not render: {e or type(e).__name__}") \
            from None
    return "".join(out)


def render_bounded(template, **context) -> str | None:
    """render_checked's text, or None when it fails: that prompt's count is then unknown."""
    try:
        return render_checked(template, **context)
    except ChatTemplateError:
        return None


def chat_prompt_tokens(
    tokenizer_path: str, tokenizer, prompts: Sequence[str | list[int]]
) -> list[int | None] | None:
    """Per prompt, its token count inside the chat template (one user message and the
    generation prompt); None for the whole run without a usable template, or per prompt
    that is not text or does not render."""
    loaded = load_chat_template(tokenizer_path)
    if loaded is None:
        return None
    out: list[int | None] = []
    for prompt in prompts:
        if not isinstance(prompt, str):
            out.append(None)
            continue
        try:
            text = loaded.render([{"role": "user", "content": prompt}])
        except ChatTemplateError:
            out.append(None)
            continue
        # The template writes the special tokens itself (BOS included): none added here.
        out.append(len(tokenizer.encode(text, add_special_tokens=False).ids))
    return out
