"""The FastAPI app: OpenAI-compatible completions and chat completions in front of the bundled
engine, plus /v1/models, /health and /metrics.

The engine is built in the bridge's thread when the app starts, so the server answers at once:
/health (and every other endpoint) says 503 until the engine is ready. A client that goes away
mid-request has its request aborted in the engine, which returns its KV blocks to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

# Streaming responses import anyio's asyncio backend on first use, inside the event loop, which
# stalls the process ~150 ms and inflates the first requests' TTFT: import it up front.
import anyio._backends._asyncio  # noqa: F401
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from cbbench.engine.request import SamplingParams
from cbbench.server.async_engine import Admitted, AsyncEngine, Failed, RequestStream, TokenEvent
from cbbench.server.auth import ApiKeyMiddleware
from cbbench.server.prometheus import CONTENT_TYPE, ServerMetrics
from cbbench.server.protocol import (
    DEFAULT_MAX_TOKENS,
    SSE_DONE,
    APIError,
    ChatRequest,
    CompletionRequest,
    error_body,
    render_chat,
    sse,
    token_times_ext,
    usage,
    validation_error,
)
from cbbench.server.request_log import RequestLog, RequestTrace
from cbbench.server.text import TextCodec, make_codec
from cbbench.server.tokenization import detokenize, parse_detokenize, parse_tokenize, tokenize

OWNED_BY = "cbbench"
ARRIVAL_KEY = "cbbench.arrival"  # the ASGI scope key of a request's arrival time
MAX_REQUEST_ID_CHARS = 128
API_NAMES = {"completion": "completions", "chat": "chat"}  # as the request log names them


@dataclass
class ServeConfig:
    served_model_name: str | None = None  # None: the engine's model name
    tokenizer: object | None = None  # a tokenizers.Tokenizer, or None for the fallback
    # Sampling for fields a request leaves out (the command line's --temperature, ...).
    defaults: SamplingParams = field(default_factory=SamplingParams)
    request_log: str | None = None  # --request-log: a JSON-lines file, appended to
    api_key: str | None = field(default=None, repr=False)  # --api-key, resolved; never shown


@dataclass(frozen=True)
class _Served:
    """What the app needs from the ready engine."""

    name: str
    codec: TextCodec
    vocab_size: int  # 0: unknown (no id check)
    max_model_len: int | None
    created: int


@dataclass(frozen=True)
class _Job:
    """One generation request, validated and encoded."""

    kind: str  # "completion" | "chat"
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    return_token_times: bool


def create_app(build: Callable[[], tuple[object, dict]], config: ServeConfig | None = None) -> FastAPI:
    """``build`` returns (engine, info) as ``build_engine`` does; it runs in the engine thread.
    ``app.state.engine`` is the bridge (its ``snapshot()`` is what /metrics reports)."""
    cfg = config or ServeConfig()
    metrics = ServerMetrics(cfg.served_model_name)
    bridge = AsyncEngine(build, observer=metrics)
    served: list[_Served] = []  # filled once, when the engine is first seen ready
    request_log = RequestLog(cfg.request_log) if cfg.request_log else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        bridge.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.to_thread(bridge.stop)
            if request_log is not None:
                await asyncio.to_thread(request_log.close)

    app = FastAPI(title="cbbench serve", lifespan=lifespan)
    app.add_middleware(_StampArrival)
    if cfg.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=cfg.api_key)
    app.state.engine = bridge
    app.state.metrics = metrics
    app.state.request_log = request_log

    def ready() -> _Served:
        if served:
            return served[0]
        if not bridge.ready:
            msg = bridge.error or "the engine is starting"
            raise APIError(503, msg, type="server_error", code="engine_not_ready")
        info = bridge.info or {}
        vocab = info.get("vocab_size") or info.get("model_config", {}).get("vocab_size") or 0
        served.append(
            _Served(
                name=cfg.served_model_name or str(info.get("model", "model")),
                codec=make_codec(cfg.tokenizer, vocab),
                vocab_size=vocab,
                max_model_len=info.get("max_model_len"),
                created=int(time.time()),
            )
        )
        return served[0]

    def check_model(s: _Served, model: str | None) -> None:
        if model is not None and model != s.name:
            raise APIError(
                404, f"the model {model!r} does not exist; this server serves {s.name!r}",
                param="model", code="model_not_found",
            )

    def sampling(body) -> SamplingParams:
        d = cfg.defaults
        top_k = body.top_k if body.top_k is not None else d.top_k
        return SamplingParams(
            temperature=body.temperature if body.temperature is not None else d.temperature,
            top_p=body.top_p if body.top_p is not None else d.top_p,
            top_k=max(top_k, 0),
            seed=body.seed,
            ignore_eos=body.ignore_eos if body.ignore_eos is not None else d.ignore_eos,
        )

    # ---- errors: always OpenAI-style JSON ------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        err = validation_error(list(exc.errors()))
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    # ---- endpoints -----------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if not bridge.ready:
            msg = bridge.error or "the engine is starting"
            return JSONResponse(error_body(msg, "server_error", code="engine_not_ready"), 503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(bridge.snapshot()), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        s = ready()
        card = {"id": s.name, "object": "model", "created": s.created, "owned_by": OWNED_BY}
        if s.max_model_len is not None:
            card["max_model_len"] = s.max_model_len
        return {"object": "list", "data": [card]}

    @app.post("/tokenize")
    async def tokenize_endpoint(request: Request):
        s = ready()
        body = parse_tokenize(await _json_body(request))
        check_model(s, body.model)
        return tokenize(body, s.codec, s.max_model_len)

    @app.post("/detokenize")
    async def detokenize_endpoint(request: Request):
        s = ready()
        body = parse_detokenize(await _json_body(request))
        check_model(s, body.model)
        return detokenize(body, s.codec, s.vocab_size)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        s = ready()
        check_model(s, body.model)
        body.check_supported()
        prompt = body.single_prompt()
        ids = s.codec.encode(prompt) if isinstance(prompt, str) else list(prompt)
        job = _Job(
            "completion", ids, body.max_tokens if body.max_tokens is not None else DEFAULT_MAX_TOKENS,
            sampling(body), body.stream, body.include_usage, body.return_token_times,
        )
        return await generate(s, job, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        s = ready()
        check_model(s, body.model)
        body.check_supported()
        ids = s.codec.encode(render_chat(body.messages))
        job = _Job(
            "chat", ids, body.output_limit(), sampling(body), body.stream, body.include_usage,
            body.return_token_times,
        )
        return await generate(s, job, request)

    # ---- generation ----------------------------------------------------------------------------
    def log(trace: RequestTrace) -> None:
        if request_log is not None:
            request_log.write(trace)

    async def generate(s: _Served, job: _Job, request: Request):
        # Ids from the client, or from a tokenizer larger than the model: an id outside the
        # vocabulary would crash a real forward pass.
        vocab = s.vocab_size
        bad = next((t for t in job.prompt_ids if not 0 <= t < vocab), None) if vocab else None
        if bad is not None:
            raise APIError(
                400, f"token id {bad} is outside the model's vocabulary of {vocab}",
                param="prompt" if job.kind == "completion" else "messages",
            )
        shape = _Shape(job.kind, s.name, request.headers.get("x-request-id"))
        trace = RequestTrace(shape.id, API_NAMES[job.kind], job.stream, request.scope[ARRIVAL_KEY])
        trace.prompt_tokens = len(job.prompt_ids)
        stream = bridge.submit(job.prompt_ids, job.max_tokens, job.sampling)
        trace.submitted = stream.submitted_s
        trace.engine_id = stream.req.request_id
        try:
            adm = await stream.next()
        except BaseException:
            stream.close()
            _end(trace, stream, "abort", 499)
            log(trace)
            raise
        if isinstance(adm, Failed):
            _end(trace, stream, "error", 503, adm.message)
            log(trace)
            raise APIError(503, adm.message, type="server_error", code="engine_not_ready")
        assert isinstance(adm, Admitted)
        trace.admitted = adm.time_s
        if adm.error is not None:
            _end(trace, stream, "rejected", 400, adm.error)
            log(trace)
            raise APIError(400, adm.error, code="request_rejected")
        if job.stream:
            events = _sse_events(stream, adm, shape, job, s.codec, trace, log)
            # If the client leaves before the body starts, the generator never runs and its
            # finally never fires: abort when it is garbage-collected instead.
            weakref.finalize(events, stream.close)
            return StreamingResponse(
                events,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _complete(stream, adm, shape, job, s.codec, request, trace, log)

    return app


async def _json_body(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except ValueError as e:
        raise APIError(400, f"malformed JSON body: {e}") from None


class _StampArrival:
    """Pure ASGI middleware: notes when each HTTP request reached the app (the request log's
    ``arrival``), before anything reads its body."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scope[ARRIVAL_KEY] = time.perf_counter()
        await self.app(scope, receive, send)


def _end(trace: RequestTrace, stream: RequestStream, finish: str, status: int, error: str | None = None) -> None:
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


def _request_id(prefix: str, header: str | None) -> str:
    """vLLM's ids: the prefix and the client's X-Request-Id when it sent a usable one, else a
    random hex id."""
    if header and len(header) <= MAX_REQUEST_ID_CHARS and header.isprintable():
        return f"{prefix}-{header}"
    return f"{prefix}-{uuid.uuid4().hex}"


class _Shape:
    """Builds the response objects of one request for its endpoint."""

    def __init__(self, kind: str, model: str, request_id: str | None = None) -> None:
        self.chat = kind == "chat"
        prefix = "chatcmpl" if self.chat else "cmpl"
        self.id = _request_id(prefix, request_id)
        self.created = int(time.time())
        self.model = model
        self.chunk_object = "chat.completion.chunk" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish_reason: str | None, role: bool = False) -> dict:
        d = self._head(self.chunk_object)
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        d["choices"] = [choice]
        return d

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        d = self._head(self.chunk_object)
        d["choices"] = []
        d["usage"] = usage(prompt_tokens, completion_tokens)
        return d

    def full(self, text: str, finish_reason: str | None, prompt_tokens: int, n: int) -> dict:
        if self.chat:
            d = self._head("chat.completion")
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        else:
            d = self._head("text_completion")
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        d["choices"] = [choice]
        d["usage"] = usage(prompt_tokens, n)
        return d


async def _sse_events(
    stream: RequestStream, adm: Admitted, shape: _Shape, job: _Job, codec: TextCodec,
    trace: RequestTrace, log: Callable[[RequestTrace], None],
) -> AsyncIterator[str]:
    """One SSE chunk per token. When the client disconnects, Starlette cancels this generator
    and ``finally`` aborts the request, which frees its KV blocks. The generator resumes after
    each ``yield`` once Starlette has written the chunk: the time then is its socket write."""
    decoder = codec.decoder()
    times: list[float] = []
    finish, status, error = "abort", 200, None
    try:
        if shape.chat:
            yield sse(shape.chunk("", None, role=True))
        while True:
            ev = await stream.next()
            if isinstance(ev, Failed):
                finish, error = "error", ev.message
                yield sse(error_body(ev.message, "server_error"))
                break
            assert isinstance(ev, TokenEvent)
            times.append(ev.time_s)
            text = decoder.push(ev.token_id)
            if ev.finish_reason is not None:
                text += decoder.flush()
            chunk = shape.chunk(text, ev.finish_reason)
            if ev.finish_reason is not None and job.return_token_times:
                chunk["cbbench"] = token_times_ext(stream.submitted_s, times)
            yield sse(chunk)
            sent = time.perf_counter()
            if len(times) == 1:
                trace.first_token, trace.first_token_sent = ev.time_s, sent
            trace.last_token, trace.last_token_sent = ev.time_s, sent
            trace.output_tokens = len(times)
            if ev.finish_reason is not None:
                finish = ev.finish_reason
                break
        if job.include_usage:
            yield sse(shape.usage_chunk(len(job.prompt_ids), len(times)))
        yield SSE_DONE
    finally:
        stream.close()
        _end(trace, stream, finish, status, error)
        log(trace)


async def _collect(stream: RequestStream) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    while True:
        ev = await stream.next()
        if isinstance(ev, Failed):
            raise APIError(503, ev.message, type="server_error")
        assert isinstance(ev, TokenEvent)
        events.append(ev)
        if ev.finish_reason is not None:
            return events


async def _wait_disconnect(request: Request) -> None:
    # Once the body is read, an ASGI server's receive() blocks until the client disconnects
    # (or the response completes), so this loop does not spin.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _complete(
    stream: RequestStream, adm: Admitted, shape: _Shape, job: _Job, codec: TextCodec,
    request: Request, trace: RequestTrace, log: Callable[[RequestTrace], None],
):
    """A non-streaming answer, aborted if the client goes away while it waits."""
    collect = asyncio.ensure_future(_collect(stream))
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait((collect, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collect.done():
            collect.cancel()
        stream.close()
    if not collect.done() or collect.cancelled():
        _end(trace, stream, "abort", 499)
        log(trace)
        return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
    if collect.exception() is not None:
        _end(trace, stream, "error", 503, str(collect.exception()))
        log(trace)
    events = collect.result()
    decoder = codec.decoder()
    text = "".join(decoder.push(ev.token_id) for ev in events) + decoder.flush()
    body = shape.full(text, events[-1].finish_reason, len(job.prompt_ids), len(events))
    if job.return_token_times:
        body["cbbench"] = token_times_ext(stream.submitted_s, [ev.time_s for ev in events])
    trace.first_token, trace.last_token = events[0].time_s, events[-1].time_s
    trace.output_tokens = len(events)
    _end(trace, stream, events[-1].finish_reason or "length", 200)

    def sent() -> None:  # runs once the body is written
        trace.first_token_sent = trace.last_token_sent = time.perf_counter()
        log(trace)

    return JSONResponse(body, background=BackgroundTask(sent))
