"""The generation endpoints, served as plain ASGI over one generation core: the hot path of
`cbbench serve`. Each API (shaping.py: completions and chat, the Responses API, Anthropic's
Messages) parses its own request and shapes its own events; what every token goes through is
here, once.

Every token of every request passes through here, so it is kept thin (see
results/serve_overhead.md for what each part cost): the body is validated by pydantic straight
from the bytes (no framework request object, dependency solving or re-validation), a streamed
token's event is a byte template with the text filled in (chunks.py), and each event goes to the
ASGI server's ``send`` directly, with no response object or task group around it.

A client that goes away is noticed by one watcher per request, waiting on ``receive()``: it
aborts the request in the engine (which frees its KV blocks) and wakes the request's coroutine
with CLIENT_GONE. The request log's ``*_sent`` times are taken as the bytes are handed to
``send``, before it is awaited (server/sent_stamp.py): never later than the client's receipt.
"""

from __future__ import annotations

import asyncio
import time

from cbbench.engine.core.request import Request
from cbbench.server.apis.anthropic_api import ANTHROPIC
from cbbench.server.apis.chat_api import CHAT, COMPLETIONS
from cbbench.server.apis.responses_api import RESPONSES
from cbbench.server.async_engine import RequestStream
from cbbench.server.context import ServeContext, Served
from cbbench.server.engine_events import Admitted, Failed, TokenEvent
from cbbench.server.images import trace_images
from cbbench.server.protocol import APIError, body_too_large, send_json
from cbbench.server.request_log import RequestTrace
from cbbench.server.request_metrics import request_metrics
from cbbench.server.sent_stamp import send_json_stamped
from cbbench.server.shaping import Api, Counts, Job, OutputTexts, StreamShaper
from cbbench.server.stream_events import ANSWER, REASONING, OutputPlan, event_kind

# path -> its API
GENERATION_PATHS: dict[str, Api] = {
    "/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT, "/v1/responses": RESPONSES,
    "/v1/messages": ANTHROPIC,
}
CLIENT_GONE = Failed("the client went away")
STOP = "stop"  # the engine's finish reason for a request a sampled token ended
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request", for the log
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


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


def header(scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` lower-case), as text."""
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


class Generation:
    """The ASGI handler of every generation endpoint."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx

    async def __call__(self, scope, receive, send, api: Api, arrival: float) -> None:
        try:
            body = await read_body(receive)
            if body is None:
                return
            s, job = api.parse(body, self.ctx)
            await self._generate(scope, receive, send, s, job, arrival)
        except APIError as e:  # raised only before a response started
            await send_json(send, e.status, api.error_body(e))

    async def _generate(self, scope, receive, send, s: Served, job: Job, arrival: float) -> None:
        ctx = self.ctx
        stream = ctx.bridge.submit(job.prompt_ids, job.max_tokens, job.sampling,
                                   encoder_flops=sum(im.encoder_flops for im in job.images),
                                   reply_ids=s.reply_ids(job.max_tokens))
        shaper = job.api.shaper(job, s, header(scope, b"x-request-id"), ctx.cfg,
                                stream.submitted_s)
        trace = RequestTrace(shaper.id, job.api.name, job.stream, arrival)
        trace.prompt_tokens = len(job.prompt_ids)
        if job.images:
            trace_images(trace, job.images)
        trace.submitted = stream.submitted_s
        trace.engine_id = stream.req.request_id
        watcher = asyncio.ensure_future(watch_disconnect(receive, [stream]))
        try:
            if await _admitted(stream, trace, s.max_model_len):
                cfg = ctx.cfg
                if job.stream:
                    await _stream(send, stream, shaper, job, s, trace, cfg.stream_interval,
                                  cfg.report_cached_tokens)
                else:
                    await _complete(send, stream, shaper, job, s, trace, cfg.report_cached_tokens)
        finally:
            watcher.cancel()
            stream.close()
            if trace.finish is None:  # cancelled: the server is shutting down
                _end(trace, stream, "abort", CLIENT_CLOSED_STATUS)
            ctx.log(trace)


async def _admitted(stream: RequestStream, trace: RequestTrace,
                    max_model_len: int | None = None) -> bool:
    """Wait for the engine to take the request: True once admitted, False when the client left
    first; APIError when the engine failed or rejected it (beyond the context: in vLLM's
    words, which clients parse)."""
    adm = await stream.next()
    if adm is CLIENT_GONE:
        _end(trace, stream, "abort", CLIENT_CLOSED_STATUS)
        return False
    if isinstance(adm, Failed):
        _end(trace, stream, "error", adm.status, adm.message)
        code = "engine_not_ready" if adm.status == 503 else None
        raise APIError(adm.status, adm.message, type="server_error", code=code)
    assert isinstance(adm, Admitted)
    trace.admitted = adm.time_s
    if adm.error is not None:
        reason = context_exceeded(stream.req, max_model_len) or adm.error
        _end(trace, stream, "rejected", 400, reason)
        raise APIError(400, reason, code="request_rejected")
    return True


def context_exceeded(req: Request, max_model_len: int | None) -> str | None:
    """vLLM's 400 for a request beyond the context (its OpenAI serving layer's words: clients
    read "maximum context length is N" out of them), or None when the request fits it. The
    engine refuses such a request first of all its reasons (scheduler.rejection_reason), so
    where this says something, the engine said the same in its own words."""
    n, p, m = max_model_len, req.num_prompt_tokens, req.max_tokens
    if not n or p < 1 or m < 1 or p + m <= n:
        return None
    if p >= n:
        return (f"This model's maximum context length is {n} tokens. However, your request "
                f"has {p} input tokens. Please reduce the length of the input messages.")
    return (f"'max_tokens' or 'max_completion_tokens' is too large: {m}. This model's maximum "
            f"context length is {n} tokens and your request has {p} input tokens "
            f"({m} > {n} - {p}).")


async def watch_disconnect(receive, streams: list[RequestStream]) -> None:
    """The client went away: abort the request's engine requests (a pooling request has one
    per input) and wake whoever waits on them with CLIENT_GONE."""
    # Once the body is read, an ASGI server's receive() blocks until the client disconnects
    # (or the response completes, when this watcher is cancelled anyway).
    while (await receive())["type"] != "http.disconnect":
        pass
    for stream in streams:
        if not stream.finished:
            stream.close()  # abort in the engine: frees its KV blocks
            stream.queue.put_nowait(CLIENT_GONE)


def _end(trace: RequestTrace, stream: RequestStream, finish: str | None, status: int,
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


def _decode(decoder, plan: OutputPlan, pending: list, n: int, last: bool,
            stopped: bool = False) -> tuple[list[tuple[str, int]], list[list[str]]]:
    """One event's tokens (``pending``, after ``n`` earlier ones) as (kind, count) runs and
    their (kind, text) pieces. ``stopped``: the last token stopped the request (an EOS or
    stop_token_ids id): it counts, but its text is not written (vLLM's detokenizer)."""
    k = len(pending)
    shown = pending[:-1] if stopped else pending
    if plan.plain:
        runs = [(ANSWER, k)]
        pieces = [[ANSWER, "".join(decoder.push(t) for t in shown)]]
    else:
        runs = plan.split(n, k)
        pieces, i = [], 0
        for kind, count in runs:
            pieces.append([kind, "".join(decoder.push(t) for t in shown[i:i + count])])
            i += count
    if last:
        pieces[-1][1] += decoder.flush()
    return runs, pieces


def _counts(trace: RequestTrace, stream: RequestStream, job: Job, n: int, cached: bool) -> Counts:
    """The request's reasoning and tool-call token counts (onto the log), for the usage, and
    its engine timings under --enable-per-request-metrics (request_metrics.py)."""
    plan = job.plan
    trace.reasoning_tokens = min(plan.reasoning_tokens, n)
    trace.tool_call_tokens = n - trace.reasoning_tokens if plan.tool_name else 0
    metrics = None
    if job.per_request_metrics:
        req = stream.req  # the admission, moved from the server's clock onto the engine's
        queued = None if trace.admitted is None else (
            trace.admitted - stream.submitted_s + req.arrival_time)
        metrics = request_metrics(req, queued)
    return Counts(trace.prompt_tokens, n, trace.reasoning_tokens, trace.cached_tokens, cached,
                  plan.reasoning_tokens > 0, trace.image_tokens, metrics)


async def _stream(send, stream: RequestStream, shaper: StreamShaper, job: Job, s: Served,
                  trace: RequestTrace, interval: int = 1, cached: bool = False) -> None:
    """One stream write per engine step's tokens for the request (under --stream-interval, the
    first token at once, then every ``interval`` tokens), in the shaper's events, then its
    closing events."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    opening = shaper.opening()
    if opening:
        await send({"type": "http.response.body", "body": opening, "more_body": True})
    decoder = s.codec.decoder()
    plan = job.plan
    times = shaper.times
    perf = time.perf_counter
    n = 0
    pending: list[int | None] = []
    events = trace.events = []
    head = b""  # what goes before the first tokens (started: the cache hits known by then)
    while True:
        ev = await stream.next()
        if not isinstance(ev, TokenEvent):
            await _stream_stopped(send, stream, shaper, trace, ev)
            return
        if n == 0 and not pending:
            # Set when the engine scheduled the request, which it has by its first token.
            trace.cached_tokens = stream.req.num_cached_tokens
            head = shaper.started(trace.cached_tokens)
        pending.extend(ev.token_ids)
        if times is not None:
            times.extend([ev.time_s] * ev.num_tokens)
        last = ev.finish_reason is not None
        # vLLM's rule: the first token goes at once, then every ``interval`` tokens (holding
        # the first too delayed TTFT by N - 1 decode steps over vLLM's, and the log's
        # first_token with it).
        if n and len(pending) < interval and not last:
            continue
        k = len(pending)
        runs, pieces = _decode(decoder, plan, pending, n, last, ev.finish_reason == STOP)
        n += k
        pending.clear()
        body = shaper.tokens(pieces, n, last, ev.finish_reason)
        if head:
            body, head = head + body, b""
        sent = perf()  # handed over: the await may resume ms after the client read it
        await send({"type": "http.response.body", "body": body, "more_body": True})
        events.append((sent, k, event_kind(runs)))
        _sent(trace, ev.time_s, sent, runs[-1][0] != REASONING, n)
        if last:
            break
    finish = ev.finish_reason
    assert finish is not None  # the loop ends on the request's last event
    counts = _counts(trace, stream, job, n, cached)
    _end(trace, stream, shaper.finish_reason(finish), 200)
    await send({"type": "http.response.body", "body": shaper.closing(counts, finish)})


def _sent(trace: RequestTrace, made: float, sent: float, output: bool, n: int) -> None:
    """An event is in the socket: the log's first / first output / last token times."""
    if trace.first_token is None:
        trace.first_token, trace.first_token_sent = made, sent
    if trace.first_output_sent is None and output:
        trace.first_output, trace.first_output_sent = made, sent
    trace.last_token, trace.last_token_sent = made, sent
    trace.output_tokens = n


async def _stream_stopped(send, stream: RequestStream, shaper: StreamShaper, trace: RequestTrace,
                          ev) -> None:
    """The stream ends early: the client went away, or the engine failed (an error event)."""
    if ev is CLIENT_GONE:
        _end(trace, stream, "abort", 200)
        return
    assert isinstance(ev, Failed)
    _end(trace, stream, "error", 200, ev.message)
    await send({"type": "http.response.body", "body": shaper.failure(ev.message)})


async def _complete(send, stream: RequestStream, shaper: StreamShaper, job: Job, s: Served,
                    trace: RequestTrace, cached: bool = False) -> None:
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
        assert isinstance(ev, TokenEvent)  # Admitted comes once, first: _admitted took it
        events.append(ev)
        if ev.finish_reason is not None:
            break
    finish = ev.finish_reason
    decoder = s.codec.decoder()
    ids = [t for e in events for t in e.token_ids]
    n = len(ids)
    trace.cached_tokens = stream.req.num_cached_tokens
    plan = job.plan
    counts = _counts(trace, stream, job, n, cached)
    r = trace.reasoning_tokens
    shown = ids[:-1] if finish == STOP else ids  # the stop token's text is not written
    reasoning = "".join(decoder.push(t) for t in shown[:r])
    rest = "".join(decoder.push(t) for t in shown[r:]) + decoder.flush()
    tool = rest if plan.tool_name is not None and n > r else None
    texts = OutputTexts(reasoning, rest if tool is None else "", tool)
    if shaper.times is not None:
        shaper.times.extend(e.time_s for e in events for _ in e.token_ids)
    body = shaper.full(texts, counts, finish)
    trace.first_token, trace.last_token = events[0].time_s, ev.time_s
    trace.output_tokens = n
    _end(trace, stream, shaper.finish_reason(finish), 200)
    trace.first_token_sent = trace.last_token_sent = await send_json_stamped(send, 200, body)
