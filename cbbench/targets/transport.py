"""The HTTP transport under the endpoint target's small requests and the metrics scraper
(aiohttp): a keep-alive connection pool, small GETs, a POST that survives the keep-alive race
(the pooled APIs' JSON answers), and the one mapping from an exception to the benchmark's
error_type (one of ERROR_TYPES). The streamed requests of a run go through stream_pool.py."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aiohttp is imported when a run starts: `cbbench` starts faster without it
    import aiohttp
    from yarl import URL

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
ERROR_BODY_CHARS = 200  # of an error response's body, kept in the record's message
USER_AGENT = "cbbench"
KEEPALIVE_S = 60.0  # an idle pooled connection is closed after this long


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

    return await within(go(), timeout_s)


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


async def post(session: aiohttp.ClientSession, url: URL, body: bytes) -> aiohttp.ClientResponse:
    """POST and read the response head. aiohttp retries only idempotent requests, so the
    keep-alive race is handled here: when a reused idle connection turns out closed by the
    server before any answer, retry once (on another connection)."""
    import aiohttp

    for attempt in (0, 1):
        flag = _Reuse()
        try:
            return await session.post(url, data=body, allow_redirects=False, trace_request_ctx=flag)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if attempt or not flag.reused or isinstance(e, aiohttp.ClientConnectorError):
                raise
    raise AssertionError("unreachable")


def body_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")[:ERROR_BODY_CHARS].strip()


if sys.version_info >= (3, 11):

    async def within(coro, timeout_s: float):
        async with asyncio.timeout(timeout_s):  # no extra task, unlike wait_for
            return await coro

else:

    async def within(coro, timeout_s: float):
        return await asyncio.wait_for(coro, timeout_s)
