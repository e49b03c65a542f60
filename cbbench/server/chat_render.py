"""A chat's messages as the prompt `cbbench serve` feeds its engine, and counts in usage and
/tokenize.

- With ``--tokenizer`` whose folder's tokenizer_config.json has a ``chat_template``: that
  template, rendered as Hugging Face's ``apply_chat_template`` renders it (the client's loader,
  load/chat_template.py, so that a client's count and this server's are one rule), and the
  text encoded without special tokens: the template writes its BOS itself (vLLM's rule for
  chat, whose ``add_special_tokens`` defaults to false). The messages reach the template as
  vLLM hands them over (chat_utils): text parts joined with ``"\\n"`` (a template that
  reads a string), no content as ``""``, an earlier tool call's ``arguments`` as the JSON
  object it holds; the request's ``tools`` on /v1/chat/completions as ``tools`` (the tools of
  /v1/responses and /v1/messages, in their own shapes, are not given to it, as before).
- Without a tokenizer, or with one that has no template: the minimal template
  (protocol.render_chat), whose text is encoded with the tokenizer's special tokens.

What no template here can express keeps its own rule on both paths: an ``image_url`` part is
not text, and its placeholder tokens (Qwen2-VL's count: images.py) follow the rendered
prompt's, where a VLM's template would put its own image markers among the text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from cbbench.load.chat_template import ChatTemplate, ChatTemplateError
from cbbench.server.protocol import APIError, ChatMessage, TextPart, Tool, render_chat
from cbbench.server.text import TextCodec

# What /tokenize's chat form and the docs call each rule.
TOKENIZER_TEMPLATE = "tokenizer_config.json chat_template"
MINIMAL_TEMPLATE = "minimal"
# vLLM joins a message's text parts with a newline for a template that reads content as a
# string (chat_utils._parse_chat_message_content_parts).
TEXT_PART_JOIN = "\n"


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat and how to encode it."""

    text: str
    # False when the template wrote its own special tokens (BOS): encoding adds none.
    add_special_tokens: bool


def _arguments(raw: str) -> object:
    """An earlier tool call's arguments as vLLM gives them to a template
    (chat_utils._postprocess_messages): the JSON they hold, ``{}`` when empty. Arguments that
    are not JSON stay the string (vLLM refuses them; this server counts them as written)."""
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def template_message(m: ChatMessage) -> dict:
    """One message as a Hugging Face template reads it (vLLM's conversation message)."""
    c = m.content
    text = c if isinstance(c, str) else TEXT_PART_JOIN.join(
        p.text for p in c or () if isinstance(p, TextPart))
    out: dict = {"role": m.role, "content": text}
    if m.tool_calls is not None:
        out["tool_calls"] = [
            {"id": call.id, "type": call.type,
             "function": {"name": call.function.name,
                          "arguments": _arguments(call.function.arguments)}}
            for call in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


class ChatRenderer:
    """The served tokenizer's chat template, or the minimal one."""

    def __init__(self, template: ChatTemplate | None = None) -> None:
        self.template = template

    @property
    def kind(self) -> str:
        return TOKENIZER_TEMPLATE if self.template is not None else MINIMAL_TEMPLATE

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
               continue_final_message: bool = False,
               tools: Sequence[Tool] | None = None) -> ChatPrompt:
        """The prompt text; a 400 when the template refuses the messages (as vLLM answers)."""
        if continue_final_message and add_generation_prompt:  # vLLM's check, in its words
            raise APIError(400, "Cannot set both `continue_final_message` and "
                           "`add_generation_prompt` to True.", param="continue_final_message")
        if self.template is None:
            if continue_final_message:
                raise APIError(400, "continue_final_message needs the tokenizer's chat "
                               "template (this server renders its minimal one)",
                               param="continue_final_message")
            # The minimal template writes no BOS: encoding adds the tokenizer's.
            return ChatPrompt(render_chat(list(messages), add_generation_prompt), True)
        try:
            text = self.template.render(
                [template_message(m) for m in messages], add_generation_prompt,
                continue_final_message,
                [t.model_dump() for t in tools] if tools else None,
            )
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from None
        return ChatPrompt(text, False)

    def encode(self, codec: TextCodec, messages: Sequence[ChatMessage],
               tools: Sequence[Tool] | None = None) -> list[int]:
        """The ids a chat request's prompt is fed to the engine as."""
        prompt = self.render(messages, tools=tools)
        return codec.encode(prompt.text, add_special_tokens=prompt.add_special_tokens)
