"""The ASGI app of `cbbench serve`: OpenAI-compatible completions, chat completions and the
Responses API (and GET /v1/responses/{id}), and Anthropic's Messages (and its
/v1/messages/count_tokens), in front of the bundled engine, plus /v1/models, vLLM's /tokenize
and /detokenize, /health and /metrics.

The generation endpoints are the hot path and are served as plain ASGI (generate.py); the
rest, light and rare, by FastAPI. The engine is built in the bridge's thread when the app starts,
so the server answers at once: /health (and every other endpoint) says 503 until the engine is
ready. A client that goes away mid-request has its request aborted in the engine, which returns
its KV blocks to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

# FastAPI's responses import anyio's asyncio backend on first use, inside the event loop, which
# stalls the process ~150 ms and inflates the first requests' TTFT: import it up front.
import anyio._backends._asyncio  # noqa: F401
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic_core import from_json
from starlette.exceptions import HTTPException as StarletteHTTPException

from cbbench.server.apis.anthropic_api import ANTHROPIC
from cbbench.server.apis.embeddings_api import embeddings_endpoint
from cbbench.server.apis.rerank_api import rerank_endpoint
from cbbench.server.apis.tokenization import detokenize, parse_tokenize, tokenize
from cbbench.server.async_engine import AsyncEngine
from cbbench.server.auth import ApiKeyGuard
from cbbench.server.context import ServeConfig, ServeContext
from cbbench.server.generate import (
    GENERATION_PATHS,
    Generation,
    body_too_large,
    capped_receive,
    header,
)
from cbbench.server.prometheus import CONTENT_TYPE, ServerMetrics
from cbbench.server.protocol import (
    APIError,
    DetokenizeRequest,
    error_body,
    parse_request,
    send_json,
    validation_error,
)

if TYPE_CHECKING:
    from cbbench.engine.core.engine import Engine

__all__ = ["ServeConfig", "create_app"]

OWNED_BY = "cbbench"
CHAT_PATH = "/v1/chat/completions"  # the one whose bodies may carry images
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"  # Anthropic's (vLLM serves it too)
METHOD_NOT_ALLOWED = 405


class ServeApp:
    """The app uvicorn runs: checks the API key, sends the generation endpoints to the plain
    ASGI handler and everything else to FastAPI. ``state`` is FastAPI's (``state.engine``:
    the engine bridge)."""

    def __init__(self, api: FastAPI, generation: Generation, guard: ApiKeyGuard | None) -> None:
        self.api = api
        self.state = api.state
        self._generation = generation
        # /v1/embeddings and /v1/rerank: plain ASGI as well (server/apis/pooling.py).
        self._pooling = {
            "/v1/embeddings": embeddings_endpoint(generation.ctx),
            "/v1/rerank": rerank_endpoint(generation.ctx),
        }
        self._guard = guard
        self._app = self._dispatch

    def add_middleware(self, cls, **options) -> None:
        """Wrap the whole app in a pure ASGI middleware (outermost), as Starlette's does."""
        self._app = cls(self._app, **options)

    async def __call__(self, scope, receive, send) -> None:
        await self._app(scope, receive, send)

    async def _dispatch(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)  # lifespan
            return
        arrival = time.perf_counter()  # the request log's arrival: headers in, body not read
        api = GENERATION_PATHS.get(scope["path"])
        # The API whose error shape a refusal here takes (count_tokens: Anthropic's).
        shape = api or (ANTHROPIC if scope["path"] == COUNT_TOKENS_PATH else None)
        if self._guard is not None and (msg := self._guard.verdict(scope)) is not None:
            await self._guard.reject(send, msg, shape)
            return
        limit = self._generation.ctx.max_body_bytes(images=scope["path"] == CHAT_PATH)
        # A declared length over the limit is refused before a byte of the body is read.
        length = header(scope, b"content-length")
        if length is not None and length.isdecimal() and int(length) > limit:
            err = body_too_large(limit)
            await send_json(send, err.status, shape.error_body(err) if shape else err.body())
            return
        receive = capped_receive(receive, limit)
        pooling = self._pooling.get(scope["path"])
        if pooling is not None and scope["method"] == "POST":
            await pooling(scope, receive, send, arrival)
        elif api is None and pooling is None:
            await self.api(scope, receive, send)
        elif scope["method"] != "POST":
            err = APIError(METHOD_NOT_ALLOWED,
                           f"{scope['method']} is not allowed on {scope['path']}: use POST")
            await send_json(send, METHOD_NOT_ALLOWED, api.error_body(err) if api else err.body())
        else:
            assert api is not None  # a pooling path that is not POST answered 405 above
            await self._generation(scope, receive, send, api, arrival)


def create_app(build: Callable[[], tuple[Engine, dict]], config: ServeConfig | None = None) -> ServeApp:
    """``build`` returns (engine, info) as ``build_engine`` does; it runs in the engine thread.
    ``app.state.engine`` is the bridge (its ``snapshot()`` is what /metrics reports)."""
    cfg = config or ServeConfig()
    metrics = ServerMetrics(cfg.served_model_name)
    bridge = AsyncEngine(build, observer=metrics)
    ctx = ServeContext(cfg, bridge, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        bridge.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.to_thread(bridge.stop)
            if ctx.request_log is not None:
                await asyncio.to_thread(ctx.request_log.close)

    api = FastAPI(title="cbbench serve", lifespan=lifespan)
    api.state.engine = bridge
    api.state.metrics = metrics
    api.state.request_log = ctx.request_log
    _add_errors(api)
    _add_endpoints(api, ctx)
    guard = ApiKeyGuard(cfg.api_key) if cfg.api_key else None
    return ServeApp(api, Generation(ctx), guard)


def _add_errors(app: FastAPI) -> None:
    """Errors are always OpenAI-style JSON."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        err = validation_error(exc.errors())
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)


def _add_endpoints(app: FastAPI, ctx: ServeContext) -> None:
    bridge = ctx.bridge

    @app.get("/health")
    async def health():
        if not bridge.ready:
            msg = bridge.error or "the engine is starting"
            return JSONResponse(error_body(msg, "server_error", code="engine_not_ready"), 503)
        return {"status": "ok"}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """vLLM's route: drop the engine's cached prefixes (between benchmark points). 200 when
        done; 409 while requests still hold KV blocks (vLLM refuses then too)."""
        ctx.ready()
        done = await bridge.reset_prefix_cache()
        if isinstance(done, str):
            return JSONResponse(error_body(done, "server_error", code="engine_not_ready"), 503)
        if not done:
            return JSONResponse(error_body(
                "requests still hold KV blocks: reset the prefix cache when the server is idle",
                "invalid_request_error", code="prefix_cache_in_use"), 409)
        return JSONResponse({"reset": True}, 200)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(ctx.metrics.render(bridge.snapshot()), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        s = ctx.ready()
        card = {"id": s.name, "object": "model", "created": s.created, "owned_by": OWNED_BY}
        if s.max_model_len is not None:
            card["max_model_len"] = s.max_model_len
        return {"object": "list", "data": [card]}

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str):
        """A stored response (``store``, the default), as created: OpenAI's and vLLM's route."""
        ctx.ready()
        r = ctx.responses.response(response_id)
        if r is None:
            raise APIError(404, f"Response with id {response_id!r} not found (this server keeps "
                           "the newest stored responses in memory)", param="response_id")
        return r

    @app.post(COUNT_TOKENS_PATH)
    async def count_tokens(request: Request):
        try:  # Anthropic's error shape, as /v1/messages answers
            return ANTHROPIC.count_tokens(await request.body(), ctx)
        except APIError as e:
            return JSONResponse(ANTHROPIC.error_body(e), e.status)

    @app.post("/tokenize")
    async def tokenize_endpoint(request: Request):
        s = ctx.ready()
        body = parse_tokenize(await _json_body(request))
        ctx.check_model(s, body.model)
        return tokenize(body, s.codec, s.max_model_len, s.chat)

    @app.post("/detokenize")
    async def detokenize_endpoint(request: Request):
        s = ctx.ready()
        body = parse_request(DetokenizeRequest, await _json_body(request))
        ctx.check_model(s, body.model)
        return detokenize(body, s.codec, s.vocab_size)


async def _json_body(request: Request) -> object:
    # pydantic's parser, as the generation endpoints use: json.loads took lone surrogates
    # ("\ud800", which no codec can encode: a 500) and recursed on deep nesting.
    try:
        return from_json(await request.body())
    except ValueError as e:
        raise APIError(400, f"malformed JSON body: {e}") from None
