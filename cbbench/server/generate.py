"""/v1/completions and /v1/chat/completions, served as plain ASGI: the hot path of `cbbench serve`.

Every token of every request passes through here, so it is kept thin (see
results/serve_overhead.md for what each part cost): the body is validated by pydantic straight
from the bytes (no framework request object, dependency solving or re-validation), a streamed
token's event is a byte template with the text filled in (chunks.py), and each event goes to the
ASGI server's ``send`` directly, with no response object or task group around it.

A client that goes away is noticed by one watcher per request, waiting on ``receive()``: it
aborts the request in the engine (which frees its KV blocks) and wakes the request's coroutine
with CLIENT_GONE. The request log's ``*_sent`` times are taken right after ``send`` returns:
the bytes are then in the socket (or its buffer, when the client reads slowly).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from pydantic import ValidationError

from cbbench.engine.core.request import SamplingParams
from cbbench.server.async_engine import RequestStream
from cbbench.server.chunks import SSE_DONE, Shape, sse_bytes
from cbbench.server.context import ServeContext, Served
from cbbench.server.engine_events import Admitted, Failed, TokenEvent
from cbbench.server.images import ImageCost, add_images, trace_images
from cbbench.server.protocol import (
    DEFAULT_MAX_TOKENS,
    APIError,
    ChatRequest,
    CompletionRequest,
    error_body,
    render_chat,
    token_times_ext,
    usage,
    validation_error,
)
from cbbench.server.request_log import RequestTrace
from cbbench.server.request_metrics import METRICS_FIELD, request_metrics
from cbbench.server.stream_events import (
    ANSWER,
    DEFAULT_REASONING_FIELD,
    REASONING,
    ChatDeltas,
    OutputPlan,
    event_kind,
)

# path -> is it chat
GENERATION_PATHS = {"/v1/completions": False, "/v1/chat/completions": True}
CLIENT_GONE = Failed("the client went away")
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request", for the log
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
JSON_TYPE = (b"content-type", b"application/json")


@dataclass(frozen=True, slots=True)
class Job:
    """One generation request, validated and encoded."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    return_token_times: bool
    continuous_usage: bool = False
    plan: OutputPlan = OutputPlan()
    per_request_metrics: bool = False  # --enable-per-request-metrics (request_metrics.py)
    images: tuple[ImageCost, ...] = ()  # chat image parts (server/images.py)


async def send_json(send, status: int, obj: dict) -> None:
    body = json.dumps(obj).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [JSON_TYPE, (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})


async def read_body(receive) -> bytes | None:
    """The whole request body; None when the client left first. (``receive`` is capped by
    ServeApp: APIError 413 beyond the body limit.)"""
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks)


def body_too_large(limit: int) -> APIError:
    return APIError(
        413, f"the request body is larger than the {limit} bytes this server accepts "
        "(64 bytes per token of the context, at least 1 MiB)", code="request_too_large",
    )


def capped_receive(receive, limit: int):
    """``receive`` that raises body_too_large once the body passes ``limit`` bytes, so no
    endpoint buffers more than that."""
    seen = 0

    async def wrapped():
        nonlocal seen
        msg = await receive()
        body = msg.get("body")
        if body:
            seen += len(body)
            if seen > limit:
                raise body_too_large(limit)
        return msg

    return wrapped


def _header(scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


class Generation:
    """The ASGI handler of both generation endpoints."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx

    async def __call__(self, scope, receive, send, chat: bool, arrival: float) -> None:
        try:
            body = await read_body(receive)
            if body is None:
                return
            s, job = self._parse(body, chat)
            await self._generate(scope, receive, send, s, job, arrival)
        except APIError as e:  # raised only before a response started
            await send_json(send, e.status, e.body())

    def _parse(self, body: bytes, chat: bool) -> tuple[Served, Job]:
        ctx = self.ctx
        try:
            req = (ChatRequest if chat else CompletionRequest).model_validate_json(body)
        except ValidationError as e:
            raise validation_error(list(e.errors())) from None
        s = ctx.ready()
        ctx.check_model(s, req.model)
        req.check_supported()
        plan = OutputPlan()
        images: tuple[ImageCost, ...] = ()
        if chat:
            ids, images = add_images(s.codec.encode(render_chat(req.messages)), req.messages, ctx)
            if not images and len(body) > ctx.max_body_bytes():  # the image allowance unused
                raise body_too_large(ctx.max_body_bytes())
            max_tokens = req.output_limit()
            plan = OutputPlan.for_request(req.reasoning_tokens, req.called_tool())
        else:
            prompt = req.single_prompt()
            ids = s.codec.encode(prompt) if isinstance(prompt, str) else list(prompt)
            max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
        # Ids from the client, or from a tokenizer larger than the model: an id outside the
        # vocabulary would crash a real forward pass.
        vocab = s.vocab_size
        bad = None
        if vocab and ids and (min(ids) < 0 or max(ids) >= vocab):  # C loops: the common case
            bad = next(t for t in ids if not 0 <= t < vocab)
        if bad is not None:
            raise APIError(
                400, f"token id {bad} is outside the model's vocabulary of {vocab}",
                param="messages" if chat else "prompt",
            )
        return s, Job(
            chat, ids, max_tokens, ctx.sampling(req), req.stream, req.include_usage,
            req.return_token_times, req.continuous_usage, plan, ctx.cfg.per_request_metrics,
            images,
        )

    async def _generate(self, scope, receive, send, s: Served, job: Job, arrival: float) -> None:
        ctx = self.ctx
        shape = Shape(job.chat, s.name, _header(scope, b"x-request-id"))
        trace = RequestTrace(shape.id, "chat" if job.chat else "completions", job.stream, arrival)
        trace.prompt_tokens = len(job.prompt_ids)
        if job.images:
            trace_images(trace, job.images)
        stream = ctx.bridge.submit(job.prompt_ids, job.max_tokens, job.sampling,
                                   encoder_flops=sum(im.encoder_flops for im in job.images))
        trace.submitted = stream.submitted_s
        trace.engine_id = stream.req.request_id
        watcher = asyncio.ensure_future(_watch_disconnect(receive, stream))
        try:
            adm = await stream.next()
            if adm is CLIENT_GONE:
                _end(trace, stream, "abort", CLIENT_CLOSED_STATUS)
                return
            if isinstance(adm, Failed):
                _end(trace, stream, "error", adm.status, adm.message)
                code = "engine_not_ready" if adm.status == 503 else None
                raise APIError(adm.status, adm.message, type="server_error", code=code)
            assert isinstance(adm, Admitted)
            trace.admitted = adm.time_s
            if adm.error is not None:
                _end(trace, stream, "rejected", 400, adm.error)
                raise APIError(400, adm.error, code="request_rejected")
            cfg = ctx.cfg
            if job.stream:
                await _stream(send, stream, shape, job, s, trace, cfg.stream_interval,
                              cfg.reasoning_field, cfg.report_cached_tokens)
            else:
                await _complete(send, stream, shape, job, s, trace, cfg.reasoning_field,
                                cfg.report_cached_tokens)
        finally:
            watcher.cancel()
            stream.close()
            if trace.finish is None:  # cancelled: the server is shutting down
                _end(trace, stream, "abort", CLIENT_CLOSED_STATUS)
            ctx.log(trace)


async def _watch_disconnect(receive, stream: RequestStream) -> None:
    # Once the body is read, an ASGI server's receive() blocks until the client disconnects
    # (or the response completes, when this watcher is cancelled anyway).
    while (await receive())["type"] != "http.disconnect":
        pass
    if not stream.finished:
        stream.close()  # abort in the engine: frees its KV blocks
        stream.queue.put_nowait(CLIENT_GONE)


def _end(trace: RequestTrace, stream: RequestStream, finish: str, status: int,
         error: str | None = None) -> None:
    """Close a trace: how it ended, and what the engine's request says (read on the event loop:
    the fields are final once the request's last event was delivered; an aborted request's may
    still move by a step)."""
    req = stream.req
    trace.finish = finish
    trace.status = status
    trace.error = error
    trace.preemptions = req.num_preemptions
    if req.first_scheduled_time is not None:
        trace.queue_exit = req.first_scheduled_time + (stream.submitted_s - req.arrival_time)


async def _stream(send, stream: RequestStream, shape: Shape, job: Job, s: Served,  # noqa: C901 - over 15 as merged from main; to split (issue 23)
                  trace: RequestTrace, interval: int = 1, reasoning_field: str | None = None,
                  cached: bool = False) -> None:
    """One SSE event per engine step's tokens for the request (every ``interval`` tokens under
    --stream-interval), then usage (when asked) and [DONE]. Plain answer tokens without
    continuous usage take the byte template; the rest are built as dicts (stream_events.py)."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    if shape.chat:
        body = sse_bytes(shape.chunk("", None, role=True))
        await send({"type": "http.response.body", "body": body, "more_body": True})
    decoder = s.codec.decoder()
    plan = job.plan
    deltas = ChatDeltas(plan, reasoning_field or DEFAULT_REASONING_FIELD) if shape.chat else None
    template = plan.plain  # plain answer tokens: the byte templates (chunks.py)
    prompt_tokens = len(job.prompt_ids)
    times: list[float] | None = [] if job.return_token_times else None
    perf = time.perf_counter
    n = 0
    pending: list[int | None] = []
    events = trace.events = []
    while True:
        ev = await stream.next()
        if ev is CLIENT_GONE:
            _end(trace, stream, "abort", 200)
            return
        if isinstance(ev, Failed):
            _end(trace, stream, "error", 200, ev.message)
            body = sse_bytes(error_body(ev.message, "server_error")) + SSE_DONE
            await send({"type": "http.response.body", "body": body})
            return
        assert isinstance(ev, TokenEvent)
        if n == 0 and not pending:
            trace.cached_tokens = stream.req.num_cached_tokens
        pending.extend(ev.token_ids)
        if times is not None:
            times.extend([ev.time_s] * ev.num_tokens)
        last = ev.finish_reason is not None
        if len(pending) < interval and not last:
            continue
        k = len(pending)
        runs = plan.split(n, k) if shape.chat else [(ANSWER, k)]
        pieces, i = [], 0
        for kind, count in runs:
            pieces.append([kind, "".join(decoder.push(t) for t in pending[i:i + count])])
            i += count
        if last:
            pieces[-1][1] += decoder.flush()
        n += k
        pending.clear()
        if template and not last:
            text = pieces[0][1]
            body = (shape.token_event_usage(text, prompt_tokens, n) if job.continuous_usage
                    else shape.token_event(text))
        else:
            if deltas is not None:
                chunk = shape.delta_chunk(deltas.delta(pieces, last),
                                          deltas.finish_reason(ev.finish_reason))
            else:
                chunk = shape.chunk(pieces[0][1], ev.finish_reason)
            if job.continuous_usage:
                chunk["usage"] = usage(prompt_tokens, n)
            if last and times is not None:
                chunk["cbbench"] = token_times_ext(stream.submitted_s, times)
            body = sse_bytes(chunk)
        await send({"type": "http.response.body", "body": body, "more_body": True})
        sent = perf()
        events.append((sent, k, event_kind(runs)))
        if trace.first_token is None:
            trace.first_token, trace.first_token_sent = ev.time_s, sent
        if trace.first_output_sent is None and runs[-1][0] != REASONING:
            trace.first_output, trace.first_output_sent = ev.time_s, sent
        trace.last_token, trace.last_token_sent = ev.time_s, sent
        trace.output_tokens = n
        if last:
            break
    _finish_counts(trace, plan, n, shape.chat)
    reason = deltas.finish_reason(ev.finish_reason) if deltas is not None else ev.finish_reason
    _end(trace, stream, reason, 200)
    tail = SSE_DONE
    if job.include_usage:
        last_chunk = shape.usage_chunk(prompt_tokens, n, **_details(trace, plan, cached))
        if job.per_request_metrics:  # vLLM's place for them: the final usage chunk
            last_chunk[METRICS_FIELD] = request_metrics(stream.req)
        tail = sse_bytes(last_chunk) + tail
    await send({"type": "http.response.body", "body": tail})


def _finish_counts(trace: RequestTrace, plan: OutputPlan, n: int, chat: bool) -> None:
    """The request's reasoning and tool-call token counts, for the log and the usage."""
    if chat:
        trace.reasoning_tokens = min(plan.reasoning_tokens, n)
        trace.tool_call_tokens = n - trace.reasoning_tokens if plan.tool_name else 0
    else:
        trace.reasoning_tokens = trace.tool_call_tokens = 0


def _details(trace: RequestTrace, plan: OutputPlan, cached: bool) -> dict:
    """usage's details: the prefix cache's hits (when the engine caches prefixes, as vLLM's
    --enable-prompt-tokens-details), and the reasoning tokens of a request that reasoned."""
    d: dict = {}
    if cached:
        d["cached_tokens"] = trace.cached_tokens or 0
    if plan.reasoning_tokens:
        d["reasoning_tokens"] = trace.reasoning_tokens
    if trace.image_tokens is not None:
        d["image_tokens"] = trace.image_tokens
    return d


async def _complete(send, stream: RequestStream, shape: Shape, job: Job, s: Served,
                    trace: RequestTrace, reasoning_field: str | None = None,
                    cached: bool = False) -> None:
    """A non-streaming answer: every token, then one JSON body."""
    events: list[TokenEvent] = []
    while True:
        ev = await stream.next()
        if ev is CLIENT_GONE:
            _end(trace, stream, "abort", CLIENT_CLOSED_STATUS)
            return
        if isinstance(ev, Failed):
            _end(trace, stream, "error", ev.status, ev.message)
            raise APIError(ev.status, ev.message, type="server_error")
        events.append(ev)
        if ev.finish_reason is not None:
            break
    decoder = s.codec.decoder()
    ids = [t for e in events for t in e.token_ids]
    n = len(ids)
    trace.cached_tokens = stream.req.num_cached_tokens
    plan = job.plan
    _finish_counts(trace, plan, n, shape.chat)
    reason, message = ev.finish_reason, None
    if shape.chat and not plan.plain:
        r = trace.reasoning_tokens
        reasoning = "".join(decoder.push(t) for t in ids[:r])
        rest = "".join(decoder.push(t) for t in ids[r:]) + decoder.flush()
        deltas = ChatDeltas(plan, reasoning_field or DEFAULT_REASONING_FIELD)
        tool = rest if plan.tool_name is not None and n > r else None
        message = deltas.message(reasoning, rest if tool is None else "", tool)
        reason = deltas.finish_reason(reason)
        text = rest
    else:
        text = "".join(decoder.push(t) for t in ids) + decoder.flush()
    body = shape.full(text, reason, len(job.prompt_ids), n, message,
                      **_details(trace, plan, cached))
    if job.per_request_metrics:
        body[METRICS_FIELD] = request_metrics(stream.req)
    if job.return_token_times:
        body["cbbench"] = token_times_ext(
            stream.submitted_s, [e.time_s for e in events for _ in e.token_ids])
    trace.first_token, trace.last_token = events[0].time_s, ev.time_s
    trace.output_tokens = n
    _end(trace, stream, reason, 200)
    await send_json(send, 200, body)
    trace.first_token_sent = trace.last_token_sent = time.perf_counter()
