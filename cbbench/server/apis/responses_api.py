"""POST /v1/responses (OpenAI's Responses API) over the generation core, in OpenAI's field names
and event types, as vLLM serves it.

The request: ``input`` (a string, or a list of items: messages ``{"role", "content"}``, a
model's earlier ``function_call`` and its ``function_call_output``), ``instructions`` (a system
message), ``max_output_tokens`` (default, and cap: the context the prompt leaves, as vLLM's), the
sampling fields, ``tools``
(``{"type": "function", "name": ...}``) and ``tool_choice``, and cbbench's ``reasoning_tokens``
extension (the first N output tokens are reasoning). The conversation is rendered with the
chat template of /v1/chat/completions (chat_render.py: the tokenizer's own, else the minimal
one), so a conversation costs the same prompt tokens on both; ``tools`` are not given to it.
A response is stored (``store``, default true, as OpenAI's) in memory, the newest 4096
within --max-stored-response-bytes (response_store.py): ``previous_response_id`` continues its conversation (its input and output
before this request's input), and GET /v1/responses/{id} answers it as created; an id not
stored is a 400 (a 404 there). A multi-turn client may equally send
the whole conversation as ``input``.

A stream is typed SSE (``event: TYPE`` / ``data: JSON``, no ``[DONE]``), every event with its
``sequence_number``: ``response.created`` and ``response.in_progress``; per output item
``response.output_item.added`` and ``response.content_part.added``, the deltas
(``response.reasoning_text.delta`` for reasoning, as vLLM writes it; ``response.output_text.delta``;
``response.function_call_arguments.delta`` for a tool call), then the item's ``*.done`` events;
finally ``response.completed`` (``status: completed``), or ``response.incomplete``
(``status: incomplete``, ``incomplete_details.reason: max_output_tokens``) when the output ran
to max_output_tokens (OpenAI's; vLLM sends response.completed with status incomplete), with
``usage``: ``input_tokens`` (``input_tokens_details.cached_tokens``), ``output_tokens``
(``output_tokens_details.reasoning_tokens``), ``total_tokens``. An engine failure mid-stream is
an ``error`` event. A request's log line has ``api: responses`` and the response's id
(``resp_...``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, Field

from cbbench.server.apis.block_stream import BlockStream, typed_event
from cbbench.server.apis.response_store import ResponseStore
from cbbench.server.chunks import request_id
from cbbench.server.protocol import (
    DEFAULT_MAX_TOKENS,
    STRICT_FINITE,
    APIError,
    ChatMessage,
    ResponseFormat,
    Seed,
    ToolCall,
    ToolCallFunction,
    UnappliedSampling,
    check_plain_text,
    check_vocab,
    parse_request,
)
from cbbench.server.shaping import Counts, Job, OutputTexts
from cbbench.server.stream_events import (
    ANSWER,
    REASONING,
    TOOL,
    TOOL_ARGS_CLOSE,
    TOOL_ARGS_OPEN,
    OutputPlan,
    escaped,
)

if TYPE_CHECKING:
    from cbbench.server.context import ServeConfig, ServeContext, Served

LENGTH = "length"
# The include value that asks for the answer's logprobs (OpenAI's; vLLM's too).
OUTPUT_LOGPROBS = "message.output_text.logprobs"


class ContentPart(BaseModel):
    model_config = STRICT_FINITE

    type: str
    text: str = ""


# A message's text parts: the user's (input_text) and an earlier answer sent back (output_text).
# Any other part (input_image, input_file, input_audio) is a 400, as /v1/messages refuses an
# unknown block: taken as "" it left the prompt short with no word of it.
TEXT_PARTS = ("input_text", "output_text")


def _message_text(content: str | list[ContentPart] | None, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for j, part in enumerate(content):
        if part.type not in TEXT_PARTS:
            raise APIError(400, f"input.{i}.content.{j}.type {part.type!r} is not supported: "
                           "this server's /v1/responses takes text parts (input_text, "
                           "output_text); /v1/chat/completions takes images",
                           param=f"input.{i}.content.{j}.type")
    return "".join(part.text for part in content)


class InputItem(BaseModel):
    """A message (``role``, ``content``), or a ``function_call`` / ``function_call_output``."""

    model_config = STRICT_FINITE

    type: str = "message"
    role: str | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""
    output: str | None = None


class FunctionTool(BaseModel):
    model_config = STRICT_FINITE

    type: Literal["function"]
    name: str = Field(min_length=1)


class NamedFunction(BaseModel):
    model_config = STRICT_FINITE

    type: Literal["function"]
    name: str


class TextConfig(BaseModel):
    model_config = STRICT_FINITE

    format: ResponseFormat | None = None  # only "text" (check_plain_text)


class ResponsesRequest(UnappliedSampling):
    model_config = STRICT_FINITE

    model: str | None = None
    # Non-empty, as chat's messages and Anthropic's are: "" or [] answered 200 with an empty
    # prompt where the other APIs answer 400.
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: Seed = None
    ignore_eos: bool | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    text: TextConfig | None = None
    include: list[str] | None = None  # OUTPUT_LOGPROBS in it is a 400 (no logprobs here)
    logit_bias: dict[str, float] | None = None  # vLLM's; changes the output: a 400 unless empty
    reasoning_tokens: int = Field(0, ge=0)  # cbbench extension

    def messages(self) -> list[ChatMessage]:
        """The conversation as chat messages (the chat template renders them)."""
        out = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        items = [InputItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for i, it in enumerate(items):
            if it.type == "message":
                if it.role is None:
                    raise APIError(400, f"input.{i}.role: Field required", param=f"input.{i}.role")
                text = _message_text(it.content, i)
                out.append(ChatMessage(role=it.role, content=text))
            elif it.type == "function_call":
                call = ToolCall(id=it.call_id, function=ToolCallFunction(name=it.name or "",
                                                                         arguments=it.arguments))
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
            elif it.type == "function_call_output":
                out.append(ChatMessage(role="tool", content=it.output or "", tool_call_id=it.call_id))
            elif it.type != "reasoning":  # a reasoning item sent back is not part of the prompt
                raise APIError(400, f"input.{i}.type {it.type!r} is not supported",
                               param=f"input.{i}.type")
        return out

    def called_tool(self) -> str | None:
        choice = self.tool_choice
        if not self.tools or choice == "none":
            return None
        if isinstance(choice, NamedFunction):
            if choice.name not in {t.name for t in self.tools}:
                raise APIError(400, f"tool_choice names {choice.name!r}, which is not in tools",
                               param="tool_choice")
            return choice.name
        return self.tools[0].name


@dataclass(frozen=True, slots=True)
class ResponsesJob:
    """A Responses request, the conversation it continues (earlier turns included), and where
    its response is stored (None: ``store: false``)."""

    req: ResponsesRequest
    conversation: list[ChatMessage]
    store: ResponseStore | None


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesShaper(BlockStream):
    """One request's Responses events (or its one response object): its output items are the
    blocks of block_stream.py."""

    def __init__(self, job: Job, model: str, client_request_id: str | None) -> None:
        super().__init__()
        self.job = job
        rj: ResponsesJob = job.request  # type: ignore[assignment]
        self.req = rj.req
        self.rj = rj
        self.id = request_id("resp", client_request_id, sep="_")
        self.created_at = int(time.time())
        self.model = model
        self.times: list[float] | None = None  # the Responses/Messages answers carry none
        self.seq = 0
        plan = job.plan
        self.plan = plan
        # The output items, in order: reasoning (when any), then the message or the call.
        self.rs_id, self.msg_id, self.fc_id = _item_id("rs"), _item_id("msg"), _item_id("fc")
        self.text = {REASONING: "", ANSWER: "", TOOL: ""}

    # ---- events ---------------------------------------------------------------------------
    def _event(self, obj: dict) -> bytes:
        obj["sequence_number"] = self.seq
        self.seq += 1
        return typed_event(obj)

    def _response(self, status: str, output: list, usage: dict | None = None,
                  incomplete: dict | None = None) -> dict:
        req, sampling = self.req, self.job.sampling
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": False, "error": None,
            "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": self.job.max_tokens, "model": self.model, "output": output,
            "parallel_tool_calls": True, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": req.store,
            "temperature": sampling.temperature, "text": {"format": {"type": "text"}},
            "tool_choice": _dump(req.tool_choice) or "auto",
            "tools": [_function_tool(t.name) for t in req.tools or ()],
            "top_p": sampling.top_p, "truncation": "disabled", "usage": usage, "metadata": {},
        }

    def opening(self) -> bytes:
        r = self._response("in_progress", [])
        return (self._event({"type": "response.created", "response": r})
                + self._event({"type": "response.in_progress", "response": r}))

    def started(self, cached_tokens: int | None) -> bytes:
        return b""  # the cache hits go in the final usage

    def _item(self, kind: str, done: bool) -> dict:
        status = "completed" if done else "in_progress"
        text = self.text[kind]
        if kind == REASONING:
            content = [{"type": "reasoning_text", "text": text}] if done else []
            return {"type": "reasoning", "id": self.rs_id, "summary": [], "content": content,
                    "status": status}
        if kind == ANSWER:
            content = [_output_text(text)] if done else []
            return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                    "content": content}
        return {"type": "function_call", "id": self.fc_id, "call_id": self.plan.tool_call_id,
                "name": self.plan.tool_name, "arguments": text if done else "", "status": status}

    def _started(self, kind: str) -> bytes:
        out = self._event({"type": "response.output_item.added", "output_index": self.index,
                           "item": self._item(kind, False)})
        if kind == TOOL:
            return out
        part = ({"type": "reasoning_text", "text": ""} if kind == REASONING
                else _output_text(""))
        item_id = self.rs_id if kind == REASONING else self.msg_id
        return out + self._event({"type": "response.content_part.added", "item_id": item_id,
                                  "output_index": self.index, "content_index": 0, "part": part})

    def _stopped(self, kind: str) -> bytes:
        text, i = self.text[kind], self.index
        done = self._item(kind, True)
        if kind == TOOL:
            # name: required by OpenAI's spec, and vLLM sends it (emit_function_call_done_events)
            out = self._event({"type": "response.function_call_arguments.done",
                               "item_id": self.fc_id, "output_index": i,
                               "name": self.plan.tool_name, "arguments": text})
        else:
            kind_type, part = (("response.reasoning_text.done", {"type": "reasoning_text", "text": text})
                               if kind == REASONING else ("response.output_text.done", _output_text(text)))
            item_id = done["id"]
            out = self._event({"type": kind_type, "item_id": item_id, "output_index": i,
                               "content_index": 0, "text": text, **({"logprobs": []} if kind == ANSWER else {})})
            out += self._event({"type": "response.content_part.done", "item_id": item_id,
                                "output_index": i, "content_index": 0, "part": part})
        return out + self._event({"type": "response.output_item.done", "output_index": i,
                                  "item": done})

    def _delta(self, kind: str, text: str) -> bytes:
        self.text[kind] += text
        if kind == REASONING:
            return self._event({"type": "response.reasoning_text.delta", "item_id": self.rs_id,
                                "output_index": self.index, "content_index": 0, "delta": text})
        if kind == ANSWER:
            return self._event({"type": "response.output_text.delta", "item_id": self.msg_id,
                                "output_index": self.index, "content_index": 0, "delta": text,
                                "logprobs": []})
        return self._event({"type": "response.function_call_arguments.delta",
                            "item_id": self.fc_id, "output_index": self.index, "delta": text})

    def _final(self, counts: Counts, engine_finish: str) -> dict:
        incomplete = engine_finish == LENGTH and not self.tool_started
        kinds = [REASONING] if self.text[REASONING] else []
        kinds.append(TOOL if self.tool_started else ANSWER)
        output = [self._item(k, True) for k in kinds]
        r = self._response(
            "incomplete" if incomplete else "completed", output, responses_usage(counts),
            {"reason": "max_output_tokens"} if incomplete else None,
        )
        self._store(r)
        return r

    def _store(self, response: dict) -> None:
        """The finished conversation, for a next request's previous_response_id (the reasoning
        is not part of it, as a chat history leaves it out)."""
        store = self.rj.store
        if store is None:
            return
        if self.tool_started:
            call = ToolCall(id=self.plan.tool_call_id, function=ToolCallFunction(
                name=self.plan.tool_name or "", arguments=self.text[TOOL]))
            reply = ChatMessage(role="assistant", content=None, tool_calls=[call])
        else:
            reply = ChatMessage(role="assistant", content=self.text[ANSWER])
        store.put(self.id, [*self.rj.conversation, reply], response, self.text[REASONING])

    def closing(self, counts: Counts, engine_finish: str) -> bytes:
        r = self._final(counts, engine_finish)
        kind = "response.incomplete" if r["status"] == "incomplete" else "response.completed"
        return self._event({"type": kind, "response": r})

    def failure(self, message: str) -> bytes:
        return self._event({"type": "error", "code": "server_error", "message": message,
                            "param": None})

    def full(self, texts: OutputTexts, counts: Counts, engine_finish: str) -> dict:
        self.text[REASONING] = texts.reasoning
        self.text[ANSWER] = texts.answer
        if texts.tool is not None:
            self.tool_started = True
            self.text[TOOL] = TOOL_ARGS_OPEN + escaped(texts.tool) + TOOL_ARGS_CLOSE
        return self._final(counts, engine_finish)


def responses_usage(c: Counts) -> dict:
    return {
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {"cached_tokens": c.cached_tokens or 0},
        "output_tokens": c.output_tokens,
        "output_tokens_details": {"reasoning_tokens": c.reasoning_tokens},
        "total_tokens": c.prompt_tokens + c.output_tokens,
    }


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_tool(name: str) -> dict:
    return {"type": "function", "name": name, "parameters": None, "strict": None}


def _dump(v) -> object:
    return v.model_dump() if isinstance(v, BaseModel) else v


class ResponsesApi:
    name = "responses"

    def parse(self, body: bytes, ctx: ServeContext) -> tuple[Served, Job]:
        req = parse_request(ResponsesRequest, body)
        s = ctx.ready()
        ctx.check_model(s, req.model)
        check_plain_text(req.text.format if req.text else None, "text.format")
        if OUTPUT_LOGPROBS in (req.include or ()):
            raise APIError(400, "logprobs are not supported", param="include")
        if req.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        conversation = req.messages()
        if req.previous_response_id is not None:
            before = ctx.responses.get(req.previous_response_id)
            if before is None:
                raise APIError(400, f"previous response with id {req.previous_response_id!r} "
                               "not found (this server keeps the newest responses in memory)",
                               param="previous_response_id", code="previous_response_not_found")
            # The earlier turns first. Their instructions are not carried over (OpenAI's rule):
            # this request's own are its system message.
            conversation = ([m for m in conversation if m.role == "system"]
                            + [m for m in before if m.role != "system"]
                            + [m for m in conversation if m.role != "system"])
        ids = s.chat.encode(s.codec, conversation)
        check_vocab(ids, s.vocab_size, "input")
        # vLLM's get_max_tokens: the context the prompt leaves, or max_output_tokens when less
        # (beyond the room it is capped, not refused as chat's max_tokens is).
        room = s.output_room(len(ids))
        limits = [n for n in (req.max_output_tokens, room) if n is not None]
        max_tokens = min(limits) if limits else DEFAULT_MAX_TOKENS
        plan = OutputPlan.for_request(req.reasoning_tokens, req.called_tool())
        store = ctx.responses if req.store else None
        return s, Job(self, ids, max_tokens, ctx.sampling(req), req.stream, plan=plan,
                      request=ResponsesJob(req, conversation, store))

    def shaper(self, job: Job, s: Served, client_request_id: str | None, cfg: ServeConfig,
               submitted_s: float) -> ResponsesShaper:
        return ResponsesShaper(job, s.name, client_request_id)

    def error_body(self, e: APIError) -> dict:
        return e.body()


RESPONSES = ResponsesApi()
