"""The OpenAI wire format as `cbbench serve` speaks it: request models, validation, errors and
response bodies.

Choices worth knowing (documented in `cbbench serve --help` too):

- Sampling fields a request leaves out (``temperature``, ``top_p``, ``top_k``, ``ignore_eos``)
  take the server's defaults from the command line, whose ``--ignore-eos`` is on: a benchmark
  wants the output lengths it asked for, not whatever the model chooses.
- ``max_tokens`` defaults as vLLM's: 16 on completions; on chat (and the Responses API's
  ``max_output_tokens``) the context the prompt leaves, ``max_model_len`` (or the KV pool's
  tokens, when fewer) less the prompt. Chat also takes ``max_completion_tokens``, which wins
  over ``max_tokens``.
- ``model`` may be left out (the served model); an unknown model is a 404 with code
  ``model_not_found``, as OpenAI answers.
- A request the engine can never fit (prompt + max_tokens beyond the context, or beyond the
  whole KV pool) is a 400 with code ``request_rejected`` and the engine's reason as message;
  beyond the context, in vLLM's words (``This model's maximum context length is N tokens
  ...``: clients parse them).
- Unknown fields are ignored (``user``, ...); fields that would change the output's
  meaning and are not supported (``n`` > 1, ``best_of`` > 1, ``echo``, ``logprobs``, ``stop``,
  ``suffix``, ``logit_bias``, a ``response_format`` other than text; vLLM's ``repetition_penalty`` other than 1, ``presence_penalty``,
  ``frequency_penalty`` and ``min_p`` other than 0, on the Responses API too, out of vLLM's
  ranges in vLLM's words) are a 400 rather than silently dropped; so is ``min_tokens`` > 0
  on the torch engine (its sampler cannot keep an end-of-sequence token from being sampled;
  the simulator's outputs run to max_tokens, which holds it). ``stop_token_ids`` (vLLM's)
  ends a request at any of those ids, finish_reason ``stop``, ignore_eos or not; the token
  counts as output, its text is not written (as vLLM's detokenizer leaves it out). Each
  field's default (0, null, an empty list or object) is accepted.
- ``return_token_times`` (a cbbench extension) adds ``"cbbench": {"arrival_time",
  "token_times"}`` to the response (streaming: to the chunk with the finish reason): the engine's
  own times, in monotonic seconds on ``time.perf_counter()``'s scale, to check a client's
  measurements against. ``arrival_time`` is when the HTTP layer handed the request to the
  engine, after parsing it.
- ``reasoning_tokens`` (a cbbench extension, chat): the first N output tokens are the model's
  reasoning, streamed in ``delta.reasoning_content`` (``--reasoning-field``) before any
  ``delta.content``; ``tools`` with ``tool_choice`` other than ``"none"``: the tokens after the
  reasoning are one call of the chosen (else the first) tool, streamed as ``delta.tool_calls``
  (docs/streaming.md). ``stream_options.continuous_usage_stats`` (vLLM's), with
  ``include_usage`` (vLLM ignores it alone), puts the running usage on every chunk, the
  opening role chunk included (``completion_tokens`` 0).
- Chat template: the --tokenizer folder's own (tokenizer_config.json's ``chat_template``),
  rendered as Hugging Face renders it and encoded without a second BOS, as vLLM serves it
  (chat_render.py). Without one (no --tokenizer, or no template beside it) a minimal template,
  the same for every model: each message as ``<|role|>\\n{content}\\n``, then
  ``<|assistant|>\\n``; text content parts are joined.
- ``image_url`` content parts (data: URLs) cost the vision tokens of Qwen2-VL's formula, after
  the text's tokens, and a vision-encoder time on the simulated GPU (server/images.py); usage
  counts them in ``prompt_tokens`` and, a cbbench extension, in
  ``prompt_tokens_details.image_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_MAX_TOKENS = 16
# A request's seed: torch's long, as vLLM's request models bound it (a 400 outside, where
# serve kept 63 bits of any integer and 2**63 and 2**70 were one seed).
Seed = Annotated[int | None, Field(ge=-(2**63), le=2**63 - 1)]
ASSISTANT_ROLE = "assistant"


# ---- errors ------------------------------------------------------------------------------------
class APIError(Exception):
    """An OpenAI-style error response."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


JSON_TYPE = (b"content-type", b"application/json")


async def send_json(send, status: int, obj: dict, headers: Sequence[tuple[bytes, bytes]] = ()
                    ) -> None:
    """One JSON answer on an ASGI ``send``, with any ``headers`` beside its type and length."""
    body = json.dumps(obj).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [JSON_TYPE, (b"content-length", str(len(body)).encode()), *headers],
    })
    await send({"type": "http.response.body", "body": body})


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """FastAPI's validation errors (malformed JSON, missing or bad fields) as one 400."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('msg', 'invalid JSON')}")
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if param:
        msg = f"{param}: {msg}"
    return APIError(400, msg, param=param)


M = TypeVar("M", bound=BaseModel)


def parse_request(model: type[M], body: bytes | object) -> M:
    """A request body (its raw JSON, or the JSON parsed) as ``model``; its first problem a
    400, as validation_error words it."""
    try:
        return (model.model_validate_json(body) if isinstance(body, bytes)
                else model.model_validate(body))
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def check_vocab(ids: list[int], vocab: int, param: str) -> None:
    """Ids from the client, or from a tokenizer larger than the model: an id outside the
    vocabulary would crash a real forward pass."""
    if vocab and ids and (min(ids) < 0 or max(ids) >= vocab):  # C loops: the common case
        bad = next(t for t in ids if not 0 <= t < vocab)
        raise APIError(400, f"token id {bad} is outside the model's vocabulary of {vocab}",
                       param=param)


# ---- requests ------------------------------------------------------------------------------------
# strict: a value of the wrong JSON type is a 400, not coerced (`"max_tokens": true` was 1,
# `"stream": "true"` true); an int still passes where a float is expected.
STRICT = ConfigDict(extra="ignore", strict=True)
# The Responses and Anthropic request models: strict, and no NaN or infinity in any number.
STRICT_FINITE = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False
    # vLLM's: the running usage (completion_tokens so far) on every chunk, so a client counts
    # each event's tokens exactly; only with include_usage, as vLLM reads it.
    continuous_usage_stats: bool = False


# vLLM's sampling fields this server's sampler does not apply (engine/torch/sampler.py applies
# temperature, top_k and top_p), each with its neutral value: the output is the same only there.
NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0, "min_p": 0.0}
PENALTY_RANGE = (-2.0, 2.0)  # vLLM's presence_penalty and frequency_penalty


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format`` (the Responses API's ``text.format``): the output's format.
    This server writes plain text; a JSON format needs a constrained decoder (vLLM's structured
    outputs), which it does not have."""

    model_config = STRICT

    type: str = "text"


# What a structured-output field gets, after its name: a 400 on every API that has one.
UNCONSTRAINED = "is not supported: this server does not constrain its output (structured outputs)"


def check_plain_text(fmt: ResponseFormat | None, param: str) -> None:
    """A format other than plain text is a 400: a 200 would be text the client's JSON parse
    (the SDK's ``chat.completions.parse``) fails on, or a schema it does not follow."""
    if fmt is not None and fmt.type != "text":
        raise APIError(400, f"{param} {fmt.type!r} {UNCONSTRAINED}; only 'text' is", param=param)


class UnappliedSampling(BaseModel):
    """vLLM's penalties and min_p, which change the tokens sampled: at their neutral values
    (or left out) accepted; out of vLLM's ranges a 400 in vLLM's words (SamplingParams'
    _verify_args); any other value a 400 too, as logit_bias is, rather than a 200 whose
    output ignored them. Checked as the request is parsed, on every API that takes them."""

    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None

    @model_validator(mode="after")
    def _refuse_unapplied(self) -> UnappliedSampling:
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if v is not None and not low <= v <= high:
                raise APIError(400, f"{name} must be in [{low:g}, {high:g}], got {v}.", param=name)
        r = self.repetition_penalty
        if r is not None and r <= 0.0:
            raise APIError(400, f"repetition_penalty must be greater than zero, got {r}.",
                           param="repetition_penalty")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise APIError(400, f"min_p must be in [0, 1], got {self.min_p}.", param="min_p")
        for name, neutral in NEUTRAL_SAMPLING.items():
            v = getattr(self, name)
            if v is not None and v != neutral:
                raise APIError(400, f"{name} is not supported: this server samples with "
                               f"temperature, top_k and top_p only ({name}={neutral:g}, or "
                               f"none, is accepted), got {v}", param=name)
        return self


VLLM_STRUCTURED_OUTPUTS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice",
                           "guided_grammar")


class _Base(UnappliedSampling):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # -1 (vLLM) and 0 both mean off
    seed: Seed = None
    ignore_eos: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    stop: str | list[str] | None = None
    # vLLM's: the request ends ("stop") at any of these ids, ignore_eos or not (engine.py).
    stop_token_ids: list[int] | None = None
    # vLLM's: no end-of-sequence before this many tokens. Held only where no output can end
    # early (the simulator's run to max_tokens); elsewhere a 400 (OpenAIApi.parse).
    min_tokens: int | None = Field(None, ge=0)
    logit_bias: dict[str, float] | None = None  # changes the output: a 400 unless empty
    response_format: ResponseFormat | None = None  # only "text" (check_plain_text)
    # vLLM's own structured outputs, beside response_format: refused as it is (the output
    # is not constrained). Typed loosely: any value given is refused.
    structured_outputs: object = None
    guided_json: object = None
    guided_regex: object = None
    guided_choice: object = None
    guided_grammar: object = None
    return_token_times: bool = False  # cbbench extension
    # cbbench extension: the first reasoning_tokens output tokens are the model's reasoning
    # (chat: streamed in delta.reasoning_content, or the field --reasoning-field names).
    reasoning_tokens: int = Field(0, ge=0)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk: vLLM's rule, continuous_usage_stats only with include_usage
        (should_include_usage), the role chunk included."""
        o = self.stream_options
        return o is not None and o.include_usage and o.continuous_usage_stats

    def check_supported(self) -> None:
        if self.n != 1:
            raise APIError(400, "only n=1 is supported", param="n")
        # vLLM's rule in its words: an option set (an empty object is none) needs a stream.
        if self.stream_options is not None and self.stream_options.model_fields_set \
                and not self.stream:
            raise APIError(400, "Stream options can only be defined when `stream=True`.",
                           param="stream_options")
        if self.stop:
            raise APIError(400, "stop sequences are not supported", param="stop")
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        check_plain_text(self.response_format, "response_format")
        for name in VLLM_STRUCTURED_OUTPUTS:
            if getattr(self, name) is not None:
                raise APIError(400, f"{name} {UNCONSTRAINED}", param=name)

    def check_min_tokens(self, max_tokens: int, outputs_run_to_max: bool) -> None:
        """min_tokens (vLLM's) above 0: held by an engine whose outputs always run to
        max_tokens (the simulator: it samples no token, so none ends a request), up to
        max_tokens; elsewhere a 400, since keeping an end-of-sequence token from being sampled
        changes which tokens are, and this server's sampler does not do that."""
        m = self.min_tokens
        if not m:
            return
        if not outputs_run_to_max:
            raise APIError(400, "min_tokens is not supported by this engine: its outputs may "
                           "end early (the simulated engine's never do)", param="min_tokens")
        if m > max_tokens:
            raise APIError(400, f"min_tokens must be less than or equal to max_tokens="
                           f"{max_tokens}, got {m}", param="min_tokens")


class CompletionRequest(_Base):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo")
        # 0 asks for the chosen tokens' logprobs (no alternatives), as OpenAI and vLLM read it.
        if self.logprobs is not None:
            raise APIError(400, "logprobs are not supported", param="logprobs")
        if self.best_of is not None and self.best_of != 1:
            raise APIError(400, "only best_of=1 is supported", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")

    def single_prompt(self) -> str | list[int]:
        """The one prompt: a string or token ids (a batch of one is accepted too)."""
        p = self.prompt
        if isinstance(p, str):
            return p
        first = p[0] if p else None
        if isinstance(first, str | list):
            if len(p) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            return first
        # Empty, or its first item an int: the strict model admits only list[int] then.
        return cast("list[int]", p)


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    model_config = STRICT

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    """An image in a chat message (OpenAI's shape): a data: URL here (server/images.py)."""

    model_config = STRICT

    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ToolCallFunction(BaseModel):
    model_config = STRICT

    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    """An assistant message's earlier tool call, as a client sends it back."""

    model_config = STRICT

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = STRICT

    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # role assistant: the calls it made
    tool_call_id: str | None = None  # role tool: the call this result answers


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


class ChatRequest(_Base):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs:
            raise APIError(400, "logprobs are not supported", param="logprobs")
        top = self.top_logprobs  # without logprobs: vLLM's checks, in its words
        if top is not None and top < 0 and top != -1:
            raise APIError(400, "`top_logprobs` must be a positive value or -1.",
                           param="top_logprobs")
        if top is not None and top != 0:
            raise APIError(400, "when using `top_logprobs`, `logprobs` must be set to true.",
                           param="top_logprobs")
        choice = self.tool_choice
        if choice is not None and choice != "none" and not self.tools:
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {
            t.function.name for t in self.tools or ()
        }:
            raise APIError(
                400, f"tool_choice names {choice.function.name!r}, which is not in tools",
                param="tool_choice",
            )

    def called_tool(self) -> str | None:
        """The function the simulated model calls: the named choice, else the first tool
        unless tool_choice is "none" (a model offered tools uses one)."""
        choice = self.tool_choice
        if not self.tools or choice == "none":
            return None
        if isinstance(choice, NamedToolChoice):
            return choice.function.name
        return self.tools[0].function.name

    def output_limit(self, room: int | None) -> int:
        """max_completion_tokens, else max_tokens, else vLLM's chat default: ``room``, the
        context the prompt leaves (Served.output_room; 16 where the context is unknown)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        if self.max_tokens is not None:
            return self.max_tokens
        return room if room is not None else DEFAULT_MAX_TOKENS


def render_chat(messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
    """The minimal chat template: role-tagged contents, then the assistant's tag. Used when
    the served tokenizer has no chat template of its own (chat_render.py)."""
    parts = []
    for m in messages:
        c = m.content
        # Image parts are not text: their placeholder tokens follow the text (images.py).
        text = c if isinstance(c, str) else "".join(
            p.text for p in c or () if isinstance(p, TextPart))
        for call in m.tool_calls or ():  # the call's tokens are part of the context
            text += f"{call.function.name}({call.function.arguments})"
        parts.append(f"<|{m.role}|>\n{text}\n")
    if add_generation_prompt:
        parts.append(f"<|{ASSISTANT_ROLE}|>\n")
    return "".join(parts)


# ---- /tokenize and /detokenize (vLLM's request and response shapes) ------------------------------
class TokenizeCompletionRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(BaseModel):
    """The chat form tokenizes what /v1/chat/completions would feed the engine.
    ``add_special_tokens`` left out follows the chat endpoint: false with the tokenizer's
    chat template (it writes the BOS itself, vLLM's default), true with the minimal template
    (it has no BOS: the encoder adds it). ``continue_final_message`` (with
    ``add_generation_prompt`` false, vLLM's rule) needs the tokenizer's template."""

    model_config = STRICT

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None  # None: the chat endpoint's rule (above)
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    tokens: list[int]


# ---- responses -------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
          reasoning_tokens: int | None = None, image_tokens: int | None = None) -> dict:
    """OpenAI's usage block; ``prompt_tokens_details.cached_tokens`` (the prompt tokens the
    prefix cache served) and ``completion_tokens_details.reasoning_tokens`` when known."""
    d: dict = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        d["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if image_tokens is not None:  # a cbbench extension: the prompt tokens images cost
        d.setdefault("prompt_tokens_details", {})["image_tokens"] = image_tokens
    if reasoning_tokens is not None:
        d["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return d


def token_times_ext(arrival_time: float, token_times: list[float]) -> dict:
    return {"arrival_time": arrival_time, "token_times": token_times, "clock": "monotonic"}


def body_too_large(limit: int) -> APIError:
    """The 413 of a body over the server's cap (generate.capped_receive, app.py, chat images)."""
    return APIError(
        413, f"the request body is larger than the {limit} bytes this server accepts "
        "(64 bytes per token of the context, at least 1 MiB)", code="request_too_large",
    )
