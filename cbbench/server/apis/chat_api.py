"""/v1/completions and /v1/chat/completions over the generation core: the request models are
protocol.py's, the bytes chunks.py's (a byte template per plain token) and stream_events.py's
(reasoning, tool-call deltas)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench.server.chunks import SSE_DONE, Shape, sse_bytes
from cbbench.server.images import ImageCost, add_images, check_image_count
from cbbench.server.protocol import (
    DEFAULT_MAX_TOKENS,
    APIError,
    ChatRequest,
    CompletionRequest,
    body_too_large,
    check_vocab,
    error_body,
    parse_request,
    token_times_ext,
    usage,
)
from cbbench.server.request_metrics import METRICS_FIELD
from cbbench.server.shaping import Counts, Job, OutputTexts
from cbbench.server.stream_events import DEFAULT_REASONING_FIELD, ChatDeltas, OutputPlan

if TYPE_CHECKING:
    from cbbench.server.context import ServeConfig, ServeContext, Served


def chat_details(c: Counts) -> dict:
    """usage's details: the prefix cache's hits (when the engine caches prefixes, as vLLM's
    --enable-prompt-tokens-details), and the reasoning tokens of a request that reasoned."""
    d: dict = {}
    if c.report_cached:
        d["cached_tokens"] = c.cached_tokens or 0
    if c.reasoned:
        d["reasoning_tokens"] = c.reasoning_tokens
    if c.image_tokens is not None:
        d["image_tokens"] = c.image_tokens
    return d


class ChatShaper:
    """One completions or chat request's chunks. Plain answer tokens without continuous usage
    take the byte template; the rest are built as dicts."""

    def __init__(self, job: Job, shape: Shape, reasoning_field: str, submitted_s: float) -> None:
        self.job = job
        self.shape = shape
        self.id = shape.id
        self.deltas = ChatDeltas(job.plan, reasoning_field) if shape.chat else None
        self.template = job.plan.plain
        self.prompt_tokens = len(job.prompt_ids)
        self.times: list[float] | None = [] if job.return_token_times else None
        self.submitted_s = submitted_s

    def opening(self) -> bytes:
        if not self.shape.chat:
            return b""
        chunk = self.shape.chunk("", None, role=True)
        if self.job.continuous_usage:  # vLLM's: the role chunk too, with no tokens yet
            chunk["usage"] = usage(self.prompt_tokens, 0)
        return sse_bytes(chunk)

    def started(self, cached_tokens: int | None) -> bytes:
        return b""  # the cache hits go in the final usage

    def tokens(self, pieces: list[list[str]], n: int, last: bool,
               engine_finish: str | None) -> bytes:
        shape, job = self.shape, self.job
        if self.template and not last:
            text = pieces[0][1]
            return (shape.token_event_usage(text, self.prompt_tokens, n) if job.continuous_usage
                    else shape.token_event(text))
        deltas = self.deltas
        if deltas is not None:
            chunk = shape.delta_chunk(deltas.delta(pieces, last), deltas.finish_reason(engine_finish))
        else:
            chunk = shape.chunk(pieces[0][1], engine_finish)
        if job.continuous_usage:
            chunk["usage"] = usage(self.prompt_tokens, n)
        if last and self.times is not None:
            chunk["cbbench"] = token_times_ext(self.submitted_s, self.times)
        return sse_bytes(chunk)

    def closing(self, counts: Counts, engine_finish: str) -> bytes:
        if not self.job.include_usage:
            return SSE_DONE
        chunk = self.shape.usage_chunk(counts.prompt_tokens, counts.output_tokens,
                                       **chat_details(counts))
        if counts.metrics is not None:  # vLLM's place for them: the final usage chunk
            chunk[METRICS_FIELD] = counts.metrics
        return sse_bytes(chunk) + SSE_DONE

    def failure(self, message: str) -> bytes:
        return sse_bytes(error_body(message, "server_error")) + SSE_DONE

    def finish_reason(self, engine_finish: str | None) -> str | None:
        return self.deltas.finish_reason(engine_finish) if self.deltas is not None else engine_finish

    def full(self, texts: OutputTexts, counts: Counts, engine_finish: str) -> dict:
        message: dict | None = None
        reason: str | None = engine_finish
        if self.deltas is not None and not self.job.plan.plain:
            message = self.deltas.message(texts.reasoning, texts.answer, texts.tool)
            reason = self.deltas.finish_reason(reason)
        text = texts.answer if texts.tool is None else texts.tool
        body = self.shape.full(text, reason, counts.prompt_tokens, counts.output_tokens, message,
                               **chat_details(counts))
        if counts.metrics is not None:
            body[METRICS_FIELD] = counts.metrics
        if self.times is not None:
            body["cbbench"] = token_times_ext(self.submitted_s, self.times)
        return body


class OpenAIApi:
    """/v1/completions (chat False) or /v1/chat/completions."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.name = "chat" if chat else "completions"

    def parse(self, body: bytes, ctx: ServeContext) -> tuple[Served, Job]:
        if self.chat:
            check_image_count(body, ctx.cfg.limit_images_per_prompt)
        req = (parse_request(ChatRequest, body) if self.chat
               else parse_request(CompletionRequest, body))
        s = ctx.ready()
        ctx.check_model(s, req.model)
        req.check_supported()
        plan = OutputPlan()
        images: tuple[ImageCost, ...] = ()
        if isinstance(req, ChatRequest):
            ids = s.chat.encode(s.codec, req.messages, req.tools)
            ids, images = add_images(ids, req.messages, ctx)
            if not images and len(body) > ctx.max_body_bytes():  # the image allowance unused
                raise body_too_large(ctx.max_body_bytes())
            max_tokens = req.output_limit(s.output_room(len(ids)))
            plan = OutputPlan.for_request(req.reasoning_tokens, req.called_tool())
        else:
            prompt = req.single_prompt()
            ids = s.codec.encode(prompt) if isinstance(prompt, str) else list(prompt)
            max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
        req.check_min_tokens(max_tokens, (ctx.bridge.info or {}).get("engine") == "sim")
        check_vocab(ids, s.vocab_size, "messages" if self.chat else "prompt")
        return s, Job(self, ids, max_tokens, ctx.sampling(req), req.stream, req.include_usage,
                      req.return_token_times, req.continuous_usage, plan, req,
                      ctx.cfg.per_request_metrics, images)

    def shaper(self, job: Job, s: Served, client_request_id: str | None, cfg: ServeConfig,
               submitted_s: float) -> ChatShaper:
        shape = Shape(self.chat, s.name, client_request_id)
        return ChatShaper(job, shape, cfg.reasoning_field or DEFAULT_REASONING_FIELD, submitted_s)

    def error_body(self, e: APIError) -> dict:
        return e.body()


COMPLETIONS = OpenAIApi(chat=False)
CHAT = OpenAIApi(chat=True)
