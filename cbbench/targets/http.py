"""The HTTP target: replay a workload against an OpenAI-compatible endpoint (vLLM, SGLang, TGI,
llama.cpp, `cbbench serve`) with an open-loop arrival schedule, and record per-request token
timestamps in the same RequestRecord form as the in-process engine.

Open loop without coordinated omission: a dispatcher starts each request at its intended time
(an absolute deadline on the run clock, so timer errors never accumulate), whatever the
server is doing; TTFT and E2EL count from that intended time (metrics.py), and the send lag
(actual send - intended) says whether the client kept up. --max-concurrency turns it into a
capped loop: a request waits for a slot, and `first_scheduled_s` records when it got one.

Each request is one streamed `/v1/completions` or `/v1/chat/completions` call over an aiohttp
keep-alive pool (see new_session; results/loadgen_capacity.md has its capacity on the 2-core
machine); every SSE event with non-empty text is a token event, timestamped when the network
read that carried it returned. Failures are recorded on their request, never raised:
error_type is one of ERROR_TYPES.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.load.interrupts import DEFAULT_GRACE_S
from cbbench.load.prompts import build_prompts, count_tokens, load_tokenizer
from cbbench.load.workload import WorkloadRequest
from cbbench.targets.scrape import MetricsScraper

if TYPE_CHECKING:  # aiohttp is imported when a run starts: `cbbench` starts faster without it
    import aiohttp
    from yarl import URL

APIS = ("completions", "chat")
API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
ERROR_TYPES = (
    "connect",
    "dns",
    "timeout",
    "http_status",
    "stream_cut",
    "bad_event",
    "interrupted",
    "client_error",
)
TOKEN_COUNT_METHODS = ("usage", "tokenizer", "events")
ERROR_BODY_CHARS = 200  # of an error response's body, kept in the record's message
ERROR_MESSAGE_CHARS = 300
BAD_EVENT_CHARS = 80
# The client fell behind when its send lag passes either limit (then TTFT/E2EL include
# client-side delay, and the figures describe the load generator as much as the server).
LAG_P50_LIMIT_MS = 10.0
LAG_P99_LIMIT_MS = 100.0
# Warn when the server's prompt counts differ from the workload's by more than this (mean).
MISMATCH_WARN_TOKENS = 2.0
MISMATCH_WARN_FRACTION = 0.02
STOP_POLL_S = 0.1
PROGRESS_INTERVAL_S = 0.1
MODELS_TIMEOUT_S = 30.0
MODELS_MAX_BYTES = 1 << 20
FD_MARGIN = 64  # file descriptors left for everything but the connection pool
USER_AGENT = "cbbench"
MAX_LINE_BYTES = 1 << 20  # the longest event-stream line buffered before it counts as bad_event
KEEPALIVE_S = 60.0  # an idle pooled connection is closed after this long
MS = 1000.0
# RFC 9110 token characters: what a header name may hold.
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---- options --------------------------------------------------------------------------------
def parse_header(text: str) -> tuple[str, str]:
    """'KEY=VALUE' -> (KEY, VALUE). A VALUE of '$NAME' or 'env:NAME' is read from the
    environment, so secrets need not appear on the command line."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(
            f"invalid --header {key or text!r}: use KEY=VALUE, e.g. --header "
            "Authorization=env:AUTH_HEADER (reads the value from $AUTH_HEADER)"
        )
    if not HEADER_NAME_RE.match(key):
        raise UsageError(f"invalid --header name {key!r}: letters, digits and -_. only")
    env_name = (
        value[1:] if value.startswith("$") else value[4:] if value.startswith("env:") else None
    )
    if env_name is not None:
        if not ENV_NAME_RE.match(env_name):
            raise UsageError(f"--header {key}: {env_name!r} is not an environment variable name")
        if env_name not in os.environ:
            raise UsageError(f"--header {key}: environment variable {env_name} is not set")
        value = os.environ[env_name]
    if "\r" in value or "\n" in value:
        raise UsageError(f"--header {key}: the value may not contain line breaks")
    return key, value


def normalize_endpoint(url: str) -> str:
    """The server's base URL: 'http://host:8000', '.../v1' and a trailing '/' all mean the
    same server; request paths (/v1/completions, /metrics) are added to it."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"invalid --endpoint {redact_url(url)!r}: use http(s)://HOST[:PORT]")
    if parts.query or parts.fragment:
        raise UsageError("--endpoint takes no query string: give the server's base URL")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def redact_url(url: str) -> str:
    """The URL without user:password@ and query (which may carry credentials)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        return "<invalid URL>"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass
class EndpointOptions:
    endpoint: str
    api: str = "completions"  # or "chat"
    served_model: str | None = None  # None: the first model of GET /v1/models
    ignore_eos_field: bool = True  # send vLLM/SGLang's `ignore_eos: true`
    headers: dict[str, str] = field(default_factory=dict)
    request_timeout_s: float = 600.0  # the whole request, send to last event
    max_concurrency: int | None = None
    tokenizer: str | None = None  # a tokenizer.json: exact synthetic prompts, token counts
    scrape_metrics: bool = False
    seed: int = 0  # synthetic prompt text; the run's seed

    def validate(self) -> None:
        normalize_endpoint(self.endpoint)
        if self.api not in APIS:
            raise UsageError(f"unknown --api {self.api!r}: use {' or '.join(APIS)}")
        t = self.request_timeout_s
        if not (t > 0 and math.isfinite(t)):
            raise UsageError(f"--request-timeout must be a positive number of seconds, got {t}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        for key, value in self.headers.items():
            try:
                value.encode("latin-1")  # what HTTP/1.1 header bytes can carry
            except UnicodeEncodeError:
                raise UsageError(f"--header {key}: the value must be ASCII/Latin-1 text") from None

    def to_config(self, served_model: str | None = None) -> dict:
        """For the result file: header *names* only (values may be API keys), and the
        endpoint without credentials. ``served_model``: the model the run resolved to."""
        return {
            "endpoint": redact_url(self.endpoint),
            "api": self.api,
            "served_model": served_model or self.served_model,
            "served_model_requested": self.served_model,
            "ignore_eos_field": self.ignore_eos_field,
            "header_names": sorted(self.headers),
            "request_timeout_s": self.request_timeout_s,
            "max_concurrency": self.max_concurrency,
            "tokenizer": self.tokenizer,
            "scrape_metrics": self.scrape_metrics,
        }


@dataclass
class HttpRun:
    records: list[RequestRecord]  # the requests that were sent, in schedule order
    duration_s: float
    interrupted: bool
    info: dict
    not_sent: int = 0


# ---- transport (aiohttp) --------------------------------------------------------------------
class HttpFailure(Exception):
    """A failed request, with the benchmark's error_type (bad_event, http_status, ...)."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type


class _Reuse:
    """Per-request flag, set when aiohttp hands the request a pooled keep-alive connection."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _on_reuse(session, ctx, params) -> None:
    if isinstance(ctx.trace_request_ctx, _Reuse):
        ctx.trace_request_ctx.reused = True


def new_session(headers: dict[str, str], max_connections: int | None) -> aiohttp.ClientSession:
    """A keep-alive connection pool (call it inside the running event loop). No timeouts of its
    own: the caller bounds each whole request. No redirects, cookies or compression: a
    benchmark request goes to the server as given, and the stream comes back as sent."""
    import aiohttp

    connector = aiohttp.TCPConnector(
        limit=max_connections or 0,  # 0: no limit
        limit_per_host=0,
        # The system resolver (socket.getaddrinfo, in a thread), never aiodns even when it is
        # installed; a connection to an IP address resolves nothing.
        resolver=aiohttp.ThreadedResolver(),
        keepalive_timeout=KEEPALIVE_S,
    )
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_on_reuse)
    return aiohttp.ClientSession(
        connector=connector,
        headers={"User-Agent": USER_AGENT, **headers},
        skip_auto_headers=("Accept-Encoding",),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[trace],
    )


async def read_body(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """Up to `limit` bytes of a response body (all of it when shorter)."""
    out = bytearray()
    while len(out) < limit and (data := await resp.content.read(limit - len(out))):
        out += data
    return bytes(out)


async def get_body(
    session: aiohttp.ClientSession, url: str, limit: int, timeout_s: float
) -> tuple[int, bytes]:
    """(status, body up to `limit` bytes) of a small GET; TimeoutError after `timeout_s`."""

    async def go() -> tuple[int, bytes]:
        async with session.get(url, allow_redirects=False) as resp:
            return resp.status, await read_body(resp, limit)

    return await _within(go(), timeout_s)


def classify(e: BaseException) -> tuple[str, str]:
    """(error_type, message) for an exception out of a request."""
    import aiohttp

    if isinstance(e, HttpFailure):
        return e.error_type, str(e)
    if isinstance(e, aiohttp.ClientConnectorError):  # TLS failures included
        cause = getattr(e, "os_error", None)
        if isinstance(cause, socket.gaierror):
            return "dns", f"cannot resolve {e.host!r}: {cause.strerror or cause}"
        return "connect", str(e)
    if isinstance(e, asyncio.TimeoutError):
        return "timeout", "timed out"
    if isinstance(e, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
        return "stream_cut", f"connection closed mid-response ({e})"
    if isinstance(e, aiohttp.ClientResponseError):  # a malformed response head
        return "bad_event", f"malformed response: {e.message}"
    if isinstance(e, OSError):  # a reset mid-response (aiohttp.ClientOSError)
        return "stream_cut", f"{type(e).__name__}: {e.strerror or e}"
    return "client_error", f"{type(e).__name__}: {e}"


# ---- one request ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Stream:
    """What a response stream told us beyond the token times."""

    done: bool = False  # saw data: [DONE]
    finished: bool = False  # saw a finish_reason
    usage: dict | None = None
    pieces: list[str] | None = None  # the text, kept only to count tokens with a tokenizer


def _chunk_fields(obj: object, chat: bool) -> tuple[str | None, bool, dict | None]:
    """(text, finished, usage) of one streamed JSON chunk; HttpFailure on a malformed or
    error event."""
    if type(obj) is not dict:
        raise HttpFailure(
            "bad_event", f"event is not a JSON object: {str(obj)[:BAD_EVENT_CHARS]!r}"
        )
    if "error" in obj or obj.get("object") == "error":  # an error reported mid-stream
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise HttpFailure("bad_event", f"server error event: {str(msg)[:ERROR_BODY_CHARS]}")
    usage = obj.get("usage")
    choices = obj.get("choices")
    if not choices:  # the final usage-only chunk
        return None, False, usage if isinstance(usage, dict) else None
    try:
        choice = choices[0]
        if chat:
            delta = choice.get("delta") or {}
            # Reasoning models stream their thinking as separate fields; those are tokens too.
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
        else:
            text = choice.get("text")
        finished = choice.get("finish_reason") is not None
    except (AttributeError, TypeError, KeyError, IndexError):
        raise HttpFailure(
            "bad_event", f"unexpected chunk shape: {str(obj)[:BAD_EVENT_CHARS]!r}"
        ) from None
    if text is not None and not isinstance(text, str):
        raise HttpFailure("bad_event", f"non-text token: {str(text)[:BAD_EVENT_CHARS]!r}")
    return text, finished, usage if isinstance(usage, dict) else None


def _body_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")[:ERROR_BODY_CHARS].strip()


if sys.version_info >= (3, 11):

    async def _within(coro, timeout_s: float):
        async with asyncio.timeout(timeout_s):  # no extra task, unlike wait_for
            return await coro

else:

    async def _within(coro, timeout_s: float):
        return await asyncio.wait_for(coro, timeout_s)


# ---- the run --------------------------------------------------------------------------------
def _raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-files limit so `wanted` connections fit; returns the pool size that
    fits (an open-loop burst opens one connection per in-flight request)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_MARGIN))


class _Runner:
    def __init__(
        self,
        opts: EndpointOptions,
        wreqs: Sequence[WorkloadRequest],
        arrivals: Sequence[float],
        prompts: list,
        tokenizer,
        should_stop: Callable[[], bool] | None,
        on_progress: Callable[[int, int], None] | None,
        grace_s: float = DEFAULT_GRACE_S,
    ):
        self.grace_s = grace_s
        self.opts = opts
        self.wreqs = wreqs
        self.arrivals = [float(a) for a in arrivals]
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.should_stop = should_stop
        self.on_progress = on_progress
        self.base = normalize_endpoint(opts.endpoint)
        self.path = API_PATHS[opts.api]
        self.chat = opts.api == "chat"
        n = len(wreqs)
        self.records: list[RequestRecord | None] = [None] * n
        self.streams: list[_Stream | None] = [None] * n
        self.pending: set[asyncio.Task] = set()
        self.sem: asyncio.Semaphore | None = None
        self.t0 = 0.0
        self.finished = 0
        self.last_progress = -math.inf
        self.in_flight = 0
        self.max_in_flight = 0
        self.stopped = False
        self.payload: dict = {}
        self.session: aiohttp.ClientSession | None = None
        self.url: URL | None = None  # base + path, set when the run starts

    # -- request path (hot) --
    def _body(self, pos: int) -> bytes:
        payload = dict(self.payload)
        prompt = self.prompts[pos]
        if self.chat:
            payload["messages"] = [{"role": "user", "content": prompt}]
        else:
            payload["prompt"] = prompt
        payload["max_tokens"] = self.wreqs[pos].output_len
        return json.dumps(payload, separators=(",", ":")).encode()

    async def _post(self, body: bytes) -> aiohttp.ClientResponse:
        """POST and read the response head. aiohttp retries only idempotent requests, so the
        keep-alive race is handled here: when a reused idle connection turns out closed by the
        server before any answer, retry once (on another connection)."""
        import aiohttp

        for attempt in (0, 1):
            flag = _Reuse()
            try:
                return await self.session.post(
                    self.url, data=body, allow_redirects=False, trace_request_ctx=flag
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if attempt or not flag.reused or isinstance(e, aiohttp.ClientConnectorError):
                    raise
        raise AssertionError("unreachable")

    async def _exchange(self, rec: RequestRecord, body: bytes, st: _Stream) -> None:
        async with await self._post(body) as resp:
            if not 200 <= resp.status < 300:
                head = _body_text(await read_body(resp, 4 * ERROR_BODY_CHARS))
                raise HttpFailure("http_status", f"HTTP {resp.status}: {head}")
            ctype = resp.headers.get("Content-Type", "")
            if ctype and "text/event-stream" not in ctype:
                head = _body_text(await read_body(resp, 4 * ERROR_BODY_CHARS))
                raise HttpFailure("bad_event", f"expected an event stream, got {ctype}: {head}")
            times, t0, now, loads, chat = (
                rec.token_times_s,
                self.t0,
                time.perf_counter,
                json.loads,
                self.chat,
            )
            content, tail = resp.content, b""
            while True:
                # Whatever has arrived (one network read, unless the loop was busy).
                piece = await content.readany()
                t = now() - t0  # when this network read returned
                if not piece:  # the end of the body
                    if not tail:
                        break
                    lines, tail = [tail], b""
                elif b"\n" in piece:
                    lines = (tail + piece).split(b"\n")
                    tail = lines.pop()
                else:
                    tail += piece
                    if len(tail) > MAX_LINE_BYTES:
                        raise HttpFailure(
                            "bad_event", f"event-stream line longer than {MAX_LINE_BYTES} bytes"
                        )
                    continue
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank separators, ': comments', 'event:' lines
                    data = line[5:].strip()  # and the \r of a CRLF line
                    if data == b"[DONE]":
                        st.done = True  # read on to the end, so the connection can be reused
                        continue
                    if st.done:
                        continue
                    try:
                        obj = loads(data)
                    except ValueError:
                        shown = data[:BAD_EVENT_CHARS].decode("utf-8", "replace")
                        raise HttpFailure("bad_event", f"malformed event: {shown!r}") from None
                    text, finished, usage = _chunk_fields(obj, chat)
                    if text:
                        times.append(t)
                        if st.pieces is not None:
                            st.pieces.append(text)
                    if finished:
                        st.finished = True
                    if usage is not None:
                        st.usage = usage
        if not (st.done or st.finished):
            raise HttpFailure(
                "stream_cut", f"stream ended before [DONE] after {len(times)} token events"
            )
        if not times:
            raise HttpFailure("bad_event", "the stream finished without any output text")

    async def _one(self, pos: int) -> None:
        w = self.wreqs[pos]
        rec = RequestRecord(
            id=w.id,
            prompt_tokens=w.prompt_len,
            output_tokens=0,
            intended_start_s=self.arrivals[pos],
            priority=w.priority,
        )
        st = _Stream(pieces=[] if self.tokenizer is not None else None)
        has_slot = False
        try:
            if self.sem is not None:
                await self.sem.acquire()
                has_slot = True
                rec.first_scheduled_s = time.perf_counter() - self.t0
            body = self._body(pos)
            self.records[pos], self.streams[pos] = rec, st
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            # Sent: the request starts now; a new connection's set-up counts towards its TTFT.
            rec.send_s = time.perf_counter() - self.t0
            try:
                await _within(self._exchange(rec, body, st), self.opts.request_timeout_s)
            except asyncio.TimeoutError:
                rec.error_type = "timeout"
                rec.error = (
                    f"no complete response within --request-timeout "
                    f"{self.opts.request_timeout_s:g} s ({len(rec.token_times_s)} token events)"
                )
            except Exception as e:  # recorded on the request, never raised
                rec.error_type, rec.error = classify(e)
                rec.error = rec.error[:ERROR_MESSAGE_CHARS]
            finally:
                self.in_flight -= 1
        except asyncio.CancelledError:  # the run was stopped; unsent requests stay unrecorded
            if rec.send_s is not None and rec.error is None:
                rec.error_type, rec.error = (
                    "interrupted",
                    "run interrupted before the request finished",
                )
        finally:
            if has_slot:
                self.sem.release()
            if rec.send_s is not None:
                self.finished += 1
                self._progress()

    def _progress(self) -> None:
        # Throttled: a progress bar needs a few updates a second, not one per request.
        if self.on_progress is None:
            return
        now = time.perf_counter()
        if now - self.last_progress >= PROGRESS_INTERVAL_S or self.finished == len(self.wreqs):
            self.last_progress = now
            self.on_progress(self.finished, len(self.wreqs))

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        order = sorted(range(len(self.wreqs)), key=self.arrivals.__getitem__)  # stable
        for pos in order:
            # An absolute deadline on the run clock: a late wake-up does not shift later sends.
            delay = self.t0 + self.arrivals[pos] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(self._one(pos))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def _watch_stop(self, dispatcher: asyncio.Task) -> None:
        while not self.should_stop():
            await asyncio.sleep(STOP_POLL_S)
        self.stopped = True
        dispatcher.cancel()
        # In-flight requests may finish within the grace period; the rest are cancelled.
        if self.pending and self.grace_s > 0:
            await asyncio.wait(set(self.pending), timeout=self.grace_s)
        for task in list(self.pending):
            task.cancel()

    async def run(self) -> tuple[float, dict]:
        o = self.opts
        wanted = o.max_concurrency or max(1, len(self.wreqs))
        pool = _raise_fd_limit(wanted)
        headers = {"Content-Type": "application/json", **o.headers}
        # Capped by the open-files limit: the excess waits for a connection inside its TTFT.
        info: dict = {"connection_pool_size": pool, "connection_pool_capped": pool < wanted}
        if o.max_concurrency:
            self.sem = asyncio.Semaphore(o.max_concurrency)
        from yarl import URL  # aiohttp's URL type: parsed once here, not on every request

        self.url = URL(self.base + self.path)
        self.session = new_session(headers, max_connections=pool)
        try:
            model = o.served_model or await self._discover_model(info)
            info["served_model"] = model
            self.payload = {
                "model": model,
                "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": 0,
            }
            if o.ignore_eos_field:
                self.payload["ignore_eos"] = True
            scraper = MetricsScraper(self.base, o.headers) if o.scrape_metrics else None
            self.t0 = time.perf_counter()
            scrape_task = asyncio.create_task(scraper.run(self.t0)) if scraper else None
            dispatcher = asyncio.create_task(self._dispatch())
            watcher = (
                asyncio.create_task(self._watch_stop(dispatcher))
                if self.should_stop is not None
                else None
            )
            try:
                await dispatcher
            except asyncio.CancelledError:
                if not self.stopped:  # the stop watcher cancels it; anything else propagates
                    raise
            while self.pending:
                await asyncio.wait(set(self.pending))
            duration = time.perf_counter() - self.t0
            if watcher is not None:
                watcher.cancel()
            if scraper is not None:
                scraper.stop()
                await scrape_task
                info.update(scraper.result())
        finally:
            await self.session.close()
        info["max_in_flight"] = self.max_in_flight
        return duration, info

    async def _discover_model(self, info: dict) -> str:
        where = redact_url(self.base + "/v1/models")
        try:
            status, body = await get_body(
                self.session, self.base + "/v1/models", MODELS_MAX_BYTES, MODELS_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            raise UsageError(f"GET {where} did not answer within {MODELS_TIMEOUT_S:g} s") from None
        except Exception as e:
            raise UsageError(
                f"cannot list the served models at {where} ({classify(e)[1]}): is the server "
                "up? --served-model NAME skips this look-up"
            ) from None
        if status != 200:
            raise UsageError(f"GET {where} answered HTTP {status}; give --served-model NAME")
        try:
            ids = [m["id"] for m in json.loads(body)["data"]]
            model = ids[0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise UsageError(f"GET {where} listed no models; give --served-model NAME") from None
        info["models_listed"] = ids[:10]
        return model


# ---- after the run --------------------------------------------------------------------------
def _count_output(rec: RequestRecord, st: _Stream, tokenizer, methods: dict[str, int]) -> None:
    """Output tokens: the server's usage, else the tokenizer over the text (a server may send
    several tokens per event), else the number of token events."""
    usage = st.usage or {}
    sp, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(sp, int):
        rec.server_prompt_tokens = sp
    if isinstance(ct, int):
        rec.output_tokens, method = ct, "usage"
    elif tokenizer is not None and st.pieces:
        rec.output_tokens, method = count_tokens(tokenizer, "".join(st.pieces)), "tokenizer"
    else:
        rec.output_tokens, method = len(rec.token_times_s), "events"
    if rec.error is None:
        methods[method] += 1


def send_lag_check(lags_ms: Sequence[float]) -> dict:
    """p50/p99 of the send lag, and whether the client fell behind its schedule."""
    if not len(lags_ms):
        return {"send_lag_p50_ms": None, "send_lag_p99_ms": None, "client_fell_behind": False}
    p50, p99 = (float(v) for v in np.percentile(np.asarray(lags_ms, dtype=np.float64), [50, 99]))
    out = {
        "send_lag_p50_ms": p50,
        "send_lag_p99_ms": p99,
        "client_fell_behind": p50 > LAG_P50_LIMIT_MS or p99 > LAG_P99_LIMIT_MS,
    }
    if out["client_fell_behind"]:
        out["client_fell_behind_message"] = (
            f"the client fell behind its arrival schedule: send lag p50 {p50:.1f} ms, p99 "
            f"{p99:.1f} ms (limits {LAG_P50_LIMIT_MS:g} / {LAG_P99_LIMIT_MS:g} ms). Latencies count "
            "from the intended start and include this lag; lower --request-rate or run the "
            "client on a less loaded machine."
        )
    return out


def prompt_mismatch(records: Sequence[RequestRecord]) -> dict | None:
    """Workload prompt length vs the server's usage.prompt_tokens."""
    pairs = [
        (r.prompt_tokens, r.server_prompt_tokens)
        for r in records
        if r.server_prompt_tokens is not None
    ]
    if not pairs:
        return None
    d = np.array([s - p for p, s in pairs], dtype=np.float64)
    return {
        "requests": len(pairs),
        "mean_diff": float(d.mean()),
        "mean_abs_diff": float(np.abs(d).mean()),
        "max_abs_diff": float(np.abs(d).max()),
    }


def _large_mismatch(mismatch: dict, records: Sequence[RequestRecord]) -> bool:
    mean_prompt = sum(r.prompt_tokens for r in records) / max(1, len(records))
    return mismatch["mean_abs_diff"] > max(
        MISMATCH_WARN_TOKENS, MISMATCH_WARN_FRACTION * mean_prompt
    )


def error_rate(records: Sequence[RequestRecord]) -> float:
    """Failed / sent, for --max-error-rate (0.0 when nothing was sent)."""
    return sum(r.error is not None for r in records) / len(records) if records else 0.0


def run_http(
    opts: EndpointOptions,
    wreqs: list[WorkloadRequest],
    arrivals: np.ndarray | Sequence[float],
    notice: Callable[[str], None],
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    keep_token_ids: bool = False,  # unused: streamed text carries no token ids
    grace_s: float = DEFAULT_GRACE_S,
) -> HttpRun:
    """Replay `wreqs` at `arrivals` (seconds from the run start) against the endpoint.
    Per-request failures land on their records; only bad options raise (UsageError)."""
    opts.validate()
    if len(arrivals) != len(wreqs):
        raise ValueError(f"{len(wreqs)} requests but {len(arrivals)} arrival times")
    tokenizer = load_tokenizer(opts.tokenizer) if opts.tokenizer else None
    prompts, kinds = build_prompts(wreqs, opts.api, opts.seed, tokenizer)
    runner = _Runner(opts, wreqs, arrivals, prompts, tokenizer, should_stop, on_progress, grace_s)
    duration, info = asyncio.run(runner.run())

    records: list[RequestRecord] = []
    methods = dict.fromkeys(TOKEN_COUNT_METHODS, 0)
    lags: list[float] = []
    for rec, st in zip(runner.records, runner.streams):
        if rec is None:
            continue
        _count_output(rec, st, tokenizer, methods)
        ready = rec.first_scheduled_s if rec.first_scheduled_s is not None else rec.intended_start_s
        lags.append((rec.send_s - ready) * MS)  # client lag only, not the wait for a slot
        records.append(rec)
    info.update(
        target="http",
        endpoint=redact_url(opts.endpoint),
        api=opts.api,
        prompt_kinds=kinds,
        token_count_method={k: v for k, v in methods.items() if v},
        not_sent=len(wreqs) - len(records),
        **send_lag_check(lags),
    )
    mismatch = prompt_mismatch(records)
    if mismatch is not None:
        info["prompt_tokens_mismatch"] = mismatch
    if info["client_fell_behind"]:
        notice("warning: " + info["client_fell_behind_message"])
    if mismatch is not None and opts.api == "completions" and _large_mismatch(mismatch, records):
        notice(
            f"warning: the server counted prompts differently from the workload (mean "
            f"|diff| {mismatch['mean_abs_diff']:.1f} tokens); give --tokenizer with the served "
            "model's tokenizer.json for exact prompt lengths"
        )
    return HttpRun(records, duration, runner.stopped, info, len(wreqs) - len(records))
