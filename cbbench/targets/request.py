"""One request against the endpoint, from the moment it is sent to its finished record:
sent -> response head checked -> streaming (SseStream) -> completed, or failed with an
error_type. The run (http.py) decides when a request is sent (its schedule, a free slot under
--max-concurrency) and what happens when the run is stopped.

The record keeps the id the server gave the response (SseStream.response_id), which joins it
to the server's logs. No X-Request-Id is sent to choose that id: vLLM makes the header its
engine's request id and refuses one already running (HTTP 400), so two clients, two workers or
a rerun reusing cbbench's numbering against one server would fail requests the server serves.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as encode_string
from typing import TYPE_CHECKING

from cbbench.analysis.records import RequestRecord
from cbbench.targets.sse import SseStream, is_event_stream
from cbbench.targets.transport import (
    ERROR_BODY_CHARS,
    HttpFailure,
    body_text,
    classify,
    post,
    read_body,
)

if TYPE_CHECKING:
    import aiohttp
    from yarl import URL

    from cbbench.targets.stream_pool import StreamPool

ERROR_MESSAGE_CHARS = 300


@dataclass(slots=True)
class RequestContext:
    """What every request of a run shares, fixed when the run starts."""

    session: aiohttp.ClientSession
    url: URL
    t0: float  # the run clock's origin (time.perf_counter)
    timeout_s: float  # the whole request, send to last event
    payload: dict  # model, stream, sampling: the fields every request body carries
    chat: bool
    # The streams' own keep-alive pool for this URL's origin (stream_pool.py); None: the
    # streams go through the aiohttp session too.
    pool: StreamPool | None = None
    # The encoded payload every request body starts with (request_body; b"": none), made on
    # the first request.
    body_head: bytes | None = None


# One encoder for every body (json.dumps with options builds a new one on each call).
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_NO_HEAD = b""  # the run's payload sets a field the request sets too: no shared head


def _body_head(payload: dict, chat: bool) -> bytes:
    """The bytes every body of the run starts with: the run's payload, encoded once, open for
    the request's own fields (json.dumps would write the same bytes, key by key)."""
    if ("messages" if chat else "prompt") in payload or "max_tokens" in payload:
        return _NO_HEAD  # its place in the body would be the payload's, not at the end
    head = _ENCODE(payload).encode()[:-1]
    return head + b"," if payload else head


def request_body(ctx: RequestContext, prompt: str | list[int], max_tokens: int,
                 extra: dict | None = None) -> bytes:
    """``extra``: the request's own fields (reasoning, tools: load/output_kinds.py)."""
    head = ctx.body_head
    if head is None:
        head = ctx.body_head = _body_head(ctx.payload, ctx.chat)
    if head and not extra and type(prompt) is str and type(max_tokens) is int:
        # The usual request: the run's head, then the prompt and max_tokens; the same bytes as
        # the dict below encoded whole, for a fifth of the CPU (issue 41).
        text = encode_string(prompt).encode()
        if ctx.chat:
            return b'%s"messages":[{"role":"user","content":%s}],"max_tokens":%d}' % (
                head, text, max_tokens)
        return b'%s"prompt":%s,"max_tokens":%d}' % (head, text, max_tokens)
    payload = dict(ctx.payload)
    if extra:
        payload.update(extra)
    if ctx.chat:
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    payload["max_tokens"] = max_tokens
    return _ENCODE(payload).encode()


async def exchange(ctx: RequestContext, body: bytes, stream: SseStream) -> None:
    """POST the body and parse the streamed answer into `stream`; HttpFailure (or a transport
    exception) when the answer is not a complete event stream."""
    if ctx.pool is not None:  # the run's path: events parsed as each network read returns
        await ctx.pool.post_stream(ctx.url, body, stream, ctx.t0)
        return
    async with await post(ctx.session, ctx.url, body) as resp:
        stream.sent()  # the body went out before the answer's head came
        if not 200 <= resp.status < 300:
            head = stream.error_text(await read_body(resp, 4 * ERROR_BODY_CHARS))
            raise HttpFailure("http_status", f"HTTP {resp.status}: {head}")
        ctype = resp.headers.get("Content-Type", "")
        if ctype and not is_event_stream(ctype):
            head = body_text(await read_body(resp, 4 * ERROR_BODY_CHARS))
            raise HttpFailure("bad_event", f"expected an event stream, got {ctype}: {head}")
        content, now, t0 = resp.content, time.perf_counter, ctx.t0
        while True:
            # Whatever has arrived (one network read, unless the loop was busy).
            piece = await content.readany()
            t = now() - t0  # when this network read returned
            if not piece:  # the end of the body
                stream.close(t)
                return
            stream.feed(piece, t)
            if stream.done:  # [DONE]: the request's end, though the body may go on (aiohttp
                stream.close(t)  # closes a connection whose body was not read to its end)
                return


async def send_request(
    ctx: RequestContext, rec: RequestRecord, body: bytes, stream: SseStream
) -> None:
    """Send now and stream the answer into `rec`. Failures are recorded on the request (error,
    error_type), never raised; only cancellation (a stopped run) propagates."""
    # Sent: the request starts now; a new connection's set-up counts towards its TTFT.
    rec.send_s = time.perf_counter() - ctx.t0
    try:
        # The timeout inline, not through transport.within: one coroutine less to resume on
        # every network read of the stream.
        if sys.version_info >= (3, 11):  # asyncio.timeout: no extra task, unlike wait_for
            async with asyncio.timeout(ctx.timeout_s):
                await exchange(ctx, body, stream)
        else:  # Python 3.10
            await asyncio.wait_for(exchange(ctx, body, stream), ctx.timeout_s)
    except asyncio.TimeoutError:
        rec.error_type = "timeout"
        rec.error = (
            f"no complete response within --request-timeout "
            f"{ctx.timeout_s:g} s ({len(rec.token_times_s)} token events)"
        )
    except Exception as e:  # recorded on the request, never raised
        rec.error_type, rec.error = classify(e)
        rec.error = rec.error[:ERROR_MESSAGE_CHARS]
