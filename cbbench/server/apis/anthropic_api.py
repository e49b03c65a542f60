"""POST /v1/messages (Anthropic's Messages API) over the generation core, in Anthropic's field
names, events and error format.

The request: ``model`` and ``max_tokens`` (both required, as Anthropic's), ``messages`` (user and
assistant turns; content a string or blocks: ``text``, an assistant's ``tool_use`` and the
user's ``tool_result``), ``system``, the sampling fields, ``tools`` (``{"name", "input_schema"}``)
and ``tool_choice`` (``auto`` | ``any`` | ``tool`` | ``none``), and cbbench's
``reasoning_tokens`` extension: the first N output tokens are the model's thinking (``thinking``
``{"type": "enabled", "budget_tokens": N}`` asks for N the same way). The
conversation is rendered with the chat template of /v1/chat/completions (chat_render.py: the
tokenizer's own, else the minimal one); ``tools`` are not given to it. ``stop_sequences`` and
structured outputs (``output_config.format``, the beta's ``output_format``) are a 400.

A stream is ``event: TYPE`` / ``data: JSON``: ``message_start`` (the message and its
``usage``, written with the first tokens, once the engine scheduled the request and its
prefix-cache hits are known); per content block ``content_block_start`` (``thinking``, ``text`` or
``tool_use``), its ``content_block_delta`` events (``thinking_delta``, then one
``signature_delta``; ``text_delta``; ``input_json_delta`` for a tool call's input, the JSON
object ``{"input": "<the tokens' text>"}``) and ``content_block_stop``; then ``message_delta``
(``stop_reason``: ``end_turn``, ``max_tokens`` or ``tool_use``; ``usage``, cumulative: every
count of the non-streamed message's) and ``message_stop``. ``usage.input_tokens`` counts the prompt tokens the prefix
cache did not serve; ``cache_read_input_tokens`` those it did (Anthropic's split; with prefix
caching off, all are input_tokens). Errors are ``{"type": "error", "error": {"type", "message"}}``
(an ``error`` event mid-stream). A request's log line has ``api: anthropic`` and the message's
id (``msg_...``).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, Field

from cbbench.server.apis.block_stream import BlockStream, typed_event
from cbbench.server.chunks import request_id
from cbbench.server.protocol import (
    STRICT_FINITE,
    UNCONSTRAINED,
    APIError,
    ChatMessage,
    Seed,
    ToolCall,
    ToolCallFunction,
    check_vocab,
    parse_request,
)
from cbbench.server.shaping import Counts, Job, OutputTexts
from cbbench.server.stream_events import ANSWER, REASONING, OutputPlan

if TYPE_CHECKING:
    from cbbench.server.context import ServeConfig, ServeContext, Served

# Anthropic's error types by HTTP status (docs: API errors).
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    529: "overloaded_error",
}
SERVER_ERROR_TYPE = "api_error"
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}
SIGNATURE = "cbbench"  # the thinking block's signature: the server signs nothing


def anthropic_error(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status, SERVER_ERROR_TYPE if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class Block(BaseModel):
    model_config = STRICT_FINITE

    type: str
    text: str = ""
    thinking: str = ""
    id: str | None = None
    name: str | None = None
    input: object = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None


class Message(BaseModel):
    model_config = STRICT_FINITE

    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    model_config = STRICT_FINITE

    name: str = Field(min_length=1)


class ToolChoice(BaseModel):
    model_config = STRICT_FINITE

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class OutputConfig(BaseModel):
    model_config = STRICT_FINITE

    format: dict | None = None  # structured outputs: a 400 (AnthropicApi.parse)


class ThinkingEnabled(BaseModel):
    """Anthropic's extended thinking: the simulated model thinks ``budget_tokens`` (at most
    max_tokens), as cbbench's reasoning_tokens makes it."""

    model_config = STRICT_FINITE

    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)


class ThinkingOff(BaseModel):
    """``disabled``; ``adaptive`` leaves it to the model, and the simulated one does not think."""

    model_config = STRICT_FINITE

    type: Literal["disabled", "adaptive"]


class MessagesPrompt(BaseModel):
    """What a Messages request's prompt is made of: also the whole body of
    /v1/messages/count_tokens (Anthropic's, and vLLM's)."""

    model_config = STRICT_FINITE

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None

    def chat_messages(self) -> list[ChatMessage]:
        out = []
        if self.system:
            out.append(ChatMessage(role="system", content=_text(self.system)))
        for m in self.messages:
            out.extend(_chat_messages(m))
        return out


class MessagesRequest(MessagesPrompt):
    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: Seed = None  # cbbench extension, as the OpenAI endpoints take it
    ignore_eos: bool | None = None  # vLLM's extension
    stream: bool = False
    stop_sequences: list[str] | None = None
    output_config: OutputConfig | None = None
    output_format: dict | None = None  # the beta's name of output_config.format
    thinking: Annotated[ThinkingEnabled | ThinkingOff, Field(discriminator="type")] | None = None
    reasoning_tokens: int = Field(0, ge=0)  # cbbench extension; given, it wins over thinking

    def thinking_tokens(self) -> int:
        if self.reasoning_tokens or not isinstance(self.thinking, ThinkingEnabled):
            return self.reasoning_tokens
        return self.thinking.budget_tokens

    def called_tool(self) -> str | None:
        choice = self.tool_choice
        if not self.tools or (choice is not None and choice.type == "none"):
            return None
        if choice is not None and choice.type == "tool":
            if choice.name not in {t.name for t in self.tools}:
                raise APIError(400, f"tool_choice names {choice.name!r}, which is not in tools")
            return choice.name
        return self.tools[0].name


def _text(content: str | list[Block] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(b.text for b in content if b.type == "text")


def _chat_messages(m: Message) -> list[ChatMessage]:
    """One Anthropic turn as chat messages: its text, an assistant's tool calls, and the tool
    results a user turn carries (each a tool message)."""
    if isinstance(m.content, str):
        return [ChatMessage(role=m.role, content=m.content)]
    out = []
    calls = [ToolCall(id=b.id, function=ToolCallFunction(name=b.name or "",
                                                         arguments=json.dumps(b.input)))
             for b in m.content if b.type == "tool_use"]
    for b in m.content:
        if b.type == "tool_result":
            out.append(ChatMessage(role="tool", content=_text(b.content),
                                   tool_call_id=b.tool_use_id))
        elif b.type not in ("text", "tool_use", "thinking", "redacted_thinking"):
            raise APIError(400, f"content block type {b.type!r} is not supported")
    text = _text(m.content)
    if text or calls:
        out.append(ChatMessage(role=m.role, content=text or None, tool_calls=calls or None))
    return out


class AnthropicShaper(BlockStream):
    """One request's Messages events (or its one message): its content blocks are the blocks
    of block_stream.py."""

    def __init__(self, job: Job, model: str, client_request_id: str | None,
                 report_cached: bool = False) -> None:
        super().__init__()
        self.job = job
        self.report_cached = report_cached  # --enable-prefix-caching: the cache fields too
        self.plan: OutputPlan = job.plan
        self.id = request_id("msg", client_request_id, sep="_")
        self.model = model
        self.times: list[float] | None = None  # the Responses/Messages answers carry none
        self.tool_id = f"toolu_{uuid.uuid4().hex[:24]}"

    _event = staticmethod(typed_event)

    def _message(self, content: list, stop_reason: str | None, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                "usage": usage}

    def opening(self) -> bytes:
        return b""  # message_start waits for the cache hits (started)

    def started(self, cached_tokens: int | None) -> bytes:
        """message_start, before the first content block: its usage is Anthropic's split of
        the prompt (input_tokens less the cache reads), known once the engine scheduled the
        request; written at the response's start it could only say 0 cached."""
        usage = _usage(len(self.job.prompt_ids), cached_tokens, self.report_cached, 0)
        return self._event({"type": "message_start", "message": self._message([], None, usage)})

    def _started(self, kind: str) -> bytes:
        if kind == REASONING:
            block: dict = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == ANSWER:
            block = {"type": "text", "text": ""}
        else:
            block = {"type": "tool_use", "id": self.tool_id, "name": self.plan.tool_name,
                     "input": {}}
        return self._event({"type": "content_block_start", "index": self.index,
                            "content_block": block})

    def _stopped(self, kind: str) -> bytes:
        out = b""
        if kind == REASONING:
            out = self._event({"type": "content_block_delta", "index": self.index,
                               "delta": {"type": "signature_delta", "signature": SIGNATURE}})
        return out + self._event({"type": "content_block_stop", "index": self.index})

    def _delta(self, kind: str, text: str) -> bytes:
        if kind == REASONING:
            delta = {"type": "thinking_delta", "thinking": text}
        elif kind == ANSWER:
            delta = {"type": "text_delta", "text": text}
        else:
            delta = {"type": "input_json_delta", "partial_json": text}
        return self._event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def _stop_reason(self, engine_finish: str) -> str:
        return "tool_use" if self.tool_started else STOP_REASONS.get(engine_finish, "end_turn")

    def closing(self, counts: Counts, engine_finish: str) -> bytes:
        delta = {"stop_reason": self._stop_reason(engine_finish), "stop_sequence": None}
        # The cumulative usage, every count of the message's (Anthropic's message_delta).
        return (self._event({"type": "message_delta", "delta": delta,
                             "usage": anthropic_usage(counts)})
                + self._event({"type": "message_stop"}))

    def failure(self, message: str) -> bytes:
        return self._event(anthropic_error(500, message))

    def full(self, texts: OutputTexts, counts: Counts, engine_finish: str) -> dict:
        content: list[dict] = []
        if texts.reasoning:
            content.append({"type": "thinking", "thinking": texts.reasoning,
                            "signature": SIGNATURE})
        if texts.tool is not None:
            self.tool_started = True
            content.append({"type": "tool_use", "id": self.tool_id, "name": self.plan.tool_name,
                            "input": {"input": texts.tool}})
        else:
            content.append({"type": "text", "text": texts.answer})
        return self._message(content, self._stop_reason(engine_finish), anthropic_usage(counts))


def anthropic_usage(c: Counts) -> dict:
    return _usage(c.prompt_tokens, c.cached_tokens, c.report_cached, c.output_tokens)


def _usage(prompt_tokens: int, cached_tokens: int | None, report_cached: bool,
           output_tokens: int) -> dict:
    """Anthropic's usage: input_tokens are the prompt tokens the prefix cache did not serve,
    cache_read_input_tokens those it did (with prefix caching on)."""
    cached = (cached_tokens or 0) if report_cached else 0
    d = {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens}
    if report_cached:
        d["cache_read_input_tokens"] = cached
        d["cache_creation_input_tokens"] = 0
    return d


class AnthropicApi:
    name = "anthropic"

    def parse(self, body: bytes, ctx: ServeContext) -> tuple[Served, Job]:
        req = parse_request(MessagesRequest, body)
        s = ctx.ready()
        ctx.check_model(s, req.model)
        if req.stop_sequences:
            raise APIError(400, "stop_sequences are not supported", param="stop_sequences")
        if req.output_format is not None or (req.output_config and req.output_config.format):
            # A JSON schema needs a constrained decoder; a 200 would be text that follows none.
            raise APIError(400, f"output_config.format {UNCONSTRAINED}", param="output_config")
        ids = s.chat.encode(s.codec, req.chat_messages())
        check_vocab(ids, s.vocab_size, "messages")
        plan = OutputPlan.for_request(req.thinking_tokens(), req.called_tool())
        return s, Job(self, ids, req.max_tokens, ctx.sampling(req), req.stream, plan=plan,
                      request=req)

    def shaper(self, job: Job, s: Served, client_request_id: str | None, cfg: ServeConfig,
               submitted_s: float) -> AnthropicShaper:
        return AnthropicShaper(job, s.name, client_request_id, cfg.report_cached_tokens)

    def error_body(self, e: APIError) -> dict:
        return anthropic_error(e.status, e.message)

    @staticmethod
    def count_tokens(body: bytes, ctx: ServeContext) -> dict:
        """POST /v1/messages/count_tokens: the prompt tokens /v1/messages charges the same
        conversation (``input_tokens``, prefix-cache hits included, as Anthropic counts)."""
        req = parse_request(MessagesPrompt, body)
        s = ctx.ready()
        ctx.check_model(s, req.model)
        return {"input_tokens": len(s.chat.encode(s.codec, req.chat_messages()))}


ANTHROPIC = AnthropicApi()
