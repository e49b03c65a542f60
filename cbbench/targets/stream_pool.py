"""The streamed POST under the endpoint target: a keep-alive pool of plain asyncio connections
whose responses httptools (llhttp, in C) parses inside the connection's Protocol, the body fed
straight from `data_received` to the request's stream parser (sse.py).

Why not aiohttp's client for the streams (it stays for the small GETs and the pooled APIs'
JSON answers, transport.py): a streamed request is one network read per token event, and
through aiohttp each read went data_received -> the response's StreamReader -> a wake-up of
the request's task -> its coroutine chain -> `readany()`, plus the request and response
objects, their headers and trace hooks per request. Profiled at 1,000 req/s of 16-token
streams that was most of the client's ~1 ms of CPU per request (results/loadgen_rust_parity.md).
Here a read is one `data_received` call that parses and timestamps the events where they
arrive; the request's coroutine wakes twice (its connection, its end). A token event's time
is still the time the network read that completed it returned (taken first thing in
`data_received`, before anything is parsed), on the run clock.

Failures keep the benchmark's error types (transport.ERROR_TYPES): a refused or failed
connection (TLS included) is `connect`, a name that does not resolve `dns`, a connection that
closes mid-response `stream_cut`, a response head llhttp cannot parse `bad_event`. The
keep-alive race is handled as transport.post does: a reused idle connection that the server
turns out to have closed before any byte of an answer is retried once on a new connection.

A connection goes back to the pool only when its answer ended cleanly: its parser did not fail,
and no byte followed the answer in its read (junk, or a response nobody asked for, would be
read as the next request's answer).

1xx interim answers (100 Continue, 103 Early Hints) are skipped for the final one (RFC 9110
section 15.2).

A stream's end event (`data: [DONE]`) ends the request, as the OpenAI SDK's does, though the
HTTP body goes on: a server that never ends it no longer costs the request its
--request-timeout. Such a connection drains: it serves again if the body's end follows (a
server writes [DONE] and the body's end apart, and they may come in two reads); it is closed if
anything else does, or once DONE_DRAIN_S passed.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import socket
import ssl as ssl_module
import time
from functools import partial
from typing import TYPE_CHECKING

import httptools

from cbbench.errors import UsageError
from cbbench.targets.sse import is_event_stream
from cbbench.targets.transport import ERROR_BODY_CHARS, KEEPALIVE_S, USER_AGENT, HttpFailure

if TYPE_CHECKING:
    from yarl import URL

    from cbbench.targets.sse import SseStream

ERROR_BODY_BYTES = 4 * ERROR_BODY_CHARS  # of a failed answer's body, read for its message
DNS_CACHE_S = 10.0  # a host name's addresses are looked up again after this (aiohttp's default)
# A body still open this long after its stream's [DONE] is not going to end: its connection is
# closed (the usual server ends it within the same write burst, microseconds after).
DONE_DRAIN_S = 1.0
# A request that finds no idle connection while one drains waits this long for the drain (its
# body's end is usually already on the wire) rather than open a connection: a handshake on its
# send path, and one more connection the server sees, where aiohttp's client (which reads to the
# body's end) reuses one. A server whose drains keep outlasting the wait is not waited for again
# after DRAIN_WAITS_MISSED such waits.
DRAIN_WAIT_S = 0.005
DRAIN_WAITS_MISSED = 3
# A response head (status line and headers, interim ones included) longer than this is not an
# answer: httptools keeps a header whole until its end, so a 400 MB header grew the client's
# memory until the request timed out. Node's and h11's limits are 16 KiB; this leaves room.
MAX_RESPONSE_HEAD_BYTES = 64 * 1024
SWITCHING_PROTOCOLS = 101  # the one 1xx answer that is not interim (an upgrade: refused)


class _StaleConnection(Exception):
    """A reused idle connection closed before any byte of the answer (the keep-alive race)."""


class _Exchange:
    """One request's answer as it arrives on a connection: its status, its content type, the
    stream it feeds, and the future its coroutine waits on (set at the end, or on a failure)."""

    __slots__ = ("stream", "t0", "done", "status", "ctype", "error_body", "streaming",
                 "got_bytes", "t", "failed", "framed", "interim", "head_bytes")

    def __init__(self, stream: SseStream, t0: float, done: asyncio.Future) -> None:
        self.stream = stream
        self.t0 = t0
        self.done = done
        self.status = 0
        self.ctype = ""
        self.error_body: bytearray | None = None  # a non-stream answer's first bytes
        self.streaming = False  # the head said 2xx and an event stream: the body is events
        self.got_bytes = False
        self.t = 0.0  # the run-clock time the current network read returned
        self.failed = False
        # The body's end is marked (chunked, or a Content-Length): a close before it is a cut
        # stream; unmarked, the body runs to the close.
        self.framed = False
        self.interim = False  # the response being read is a 1xx interim one: the answer follows
        self.head_bytes = 0  # read before the final head ended (MAX_RESPONSE_HEAD_BYTES)


class StreamConnection(asyncio.Protocol):
    """One keep-alive connection: the parser of its responses, and the request it carries."""

    def __init__(self, pool: StreamPool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        # Read heads as aiohttp's client does (vLLM's and AIPerf's benchmarks; h11 reads them
        # too): a bare LF ends a line (RFC 9112 section 2.2), a folded header is unfolded
        # (section 5.2: a user agent must), spaces may follow a chunk's size.
        self.parser.set_dangerous_leniencies(
            lenient_headers=True, lenient_optional_cr_before_lf=True,
            lenient_spaces_after_chunk_size=True)
        self.transport: asyncio.Transport | None = None
        self.ex: _Exchange | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        # Its answer ended cleanly in the read being parsed: back to the pool once the read is
        # parsed, unless more bytes follow it there.
        self.reusable = False
        # Its request ended at the stream's [DONE] before the HTTP body ended: not reusable
        # until the body's end comes.
        self.draining = False

    # ---- the transport's callbacks ----
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None:
            if self.draining:  # the rest of a body after its stream's [DONE]
                self._drain(data)
            else:  # bytes on an idle connection: nothing to match them to; drop it
                self.close()
            return
        ex.t = time.perf_counter() - ex.t0  # when this network read returned
        ex.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:  # a malformed head or chunk framing
            self._broken(HttpFailure("bad_event", f"malformed response: {e}"))
            return
        except httptools.HttpParserUpgrade:
            self._broken(HttpFailure("bad_event", "malformed response: an upgrade"))
            return
        if not ex.status and self.ex is ex:  # still in the head: bounded (checked after the
            ex.head_bytes += len(data)        # read, so one read's worth past the limit at most)
            if ex.head_bytes > MAX_RESPONSE_HEAD_BYTES:
                self._broken(HttpFailure("bad_event", "malformed response: its head is over "
                                         f"{MAX_RESPONSE_HEAD_BYTES} bytes"))
                return
        if self.ex is ex:  # the answer goes on past this read...
            if ex.stream.done:  # ...but its stream ended ([DONE]): so does the request
                self._end_at_done(ex)
        elif self.reusable:  # it ended in this read, nothing after it
            self.reusable = False
            self.pool.release(self)

    def _broken(self, failure: HttpFailure) -> None:
        """The parser failed: the connection is closed (a parser past an error cannot read the
        next answer), and the request, if still reading, fails."""
        self.reusable = False
        if self.ex is not None:
            self._fail(failure)
        self.close()  # after the answer's end too: junk after it

    def _drain(self, data: bytes) -> None:
        """A read after the request ended at [DONE] (its bytes are not the request's): the
        body's clean end makes the connection reusable (on_message_complete); a failed parse,
        bytes past the end, or an end without keep-alive close it."""
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.close()
            return
        if self.reusable:
            self.reusable = False
            self.pool.drained(self)
        elif not self.draining:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        ex = self.ex
        if ex is None or ex.done.done():
            return
        if self.reused and not ex.got_bytes:
            ex.done.set_exception(_StaleConnection())
            return
        if ex.status and not ex.framed:  # a body that runs to the close: it ended here (an
            self.ex = None                 # error's too: HTTP/1.0, Python's http.server)
            if ex.streaming:
                try:
                    ex.stream.close(time.perf_counter() - ex.t0)
                except HttpFailure as e:
                    ex.done.set_exception(e)
                    return
            ex.done.set_result(None)
            return
        why = f"{type(exc).__name__}: {exc}" if exc is not None else "Server disconnected"
        ex.done.set_exception(HttpFailure("stream_cut", f"connection closed mid-response ({why})"))

    # ---- the parser's callbacks ----
    def on_message_begin(self) -> None:
        if self.ex is None and not self.draining:  # a response after the answer's end: junk
            self.reusable = False
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.ex
        if ex is None:
            return
        key = name.lower()
        if key == b"content-type":
            ex.ctype = value.decode("latin-1")
        elif key == b"transfer-encoding" or key == b"content-length":
            ex.framed = True

    def on_headers_complete(self) -> None:
        ex = self.ex
        if ex is None:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != SWITCHING_PROTOCOLS:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows, with
            # headers of its own (RFC 9110 section 15.2).
            ex.interim = True
            ex.ctype = ""
            ex.framed = False
            return
        ex.status = status
        if 200 <= status < 300 and (not ex.ctype or is_event_stream(ex.ctype)):
            ex.streaming = True
        else:
            ex.error_body = bytearray()

    def on_body(self, body: bytes) -> None:
        ex = self.ex
        if ex is None or ex.failed:
            return
        if ex.streaming:
            try:
                ex.stream.feed(body, ex.t)
            except HttpFailure as e:  # a malformed or error event: the request failed
                self._fail(e)
            return
        assert ex.error_body is not None
        ex.error_body += body[: ERROR_BODY_BYTES - len(ex.error_body)]
        if len(ex.error_body) >= ERROR_BODY_BYTES:  # enough for the message: stop reading
            self._finish(keep=False)

    def on_message_complete(self) -> None:
        ex = self.ex
        if ex is None:
            if self.draining:  # the body after [DONE] ended: the connection can serve again
                self.draining = False
                self.reusable = self.parser.should_keep_alive()
            return
        if ex.failed:
            return
        if ex.interim:
            ex.interim = False
            return
        if ex.streaming:
            try:
                ex.stream.close(ex.t)
            except HttpFailure as e:
                self._fail(e, keep=self.parser.should_keep_alive())
                return
        self._finish(keep=self.parser.should_keep_alive())

    # ---- the request's side ----
    def start(self, ex: _Exchange, data: bytes) -> None:
        self.ex = ex
        assert self.transport is not None
        self.transport.write(data)

    def _settle(self, e: BaseException | None) -> None:
        """The request's answer is over: its coroutine is woken (with `e`, its failure)."""
        ex = self.ex
        assert ex is not None
        ex.failed = True  # nothing more goes to this request
        if not ex.done.done():
            if e is None:
                ex.done.set_result(None)
            else:
                ex.done.set_exception(e)
        self.ex = None

    def _finish(self, keep: bool) -> None:
        self._settle(None)
        self._after(keep)

    def _fail(self, e: BaseException, keep: bool = False) -> None:
        ex = self.ex
        if ex is None or ex.failed:
            return
        self._settle(e)
        self._after(keep)

    def _after(self, keep: bool) -> None:
        """keep: the answer ended cleanly; the connection goes back to the pool once the rest
        of its read is parsed (data_received), if nothing follows the answer there."""
        if keep and not self.closed:
            self.reusable = True
        else:
            self.close()

    def _end_at_done(self, ex: _Exchange) -> None:
        """The stream's [DONE] came, and its HTTP body did not end in the same read: the
        request ends here, with what it read. The connection drains (or closes: a body that
        runs to the close, or a server that closes after it, has no next answer)."""
        try:
            ex.stream.close(ex.t)
        except HttpFailure as e:
            self._settle(e)
        else:
            self._settle(None)
        if ex.framed and self.parser.should_keep_alive():
            self.draining = True
            self.pool.drain(self)
        else:
            self.close()

    def abandon(self) -> None:
        """The request was cancelled or timed out mid-answer: the connection closes (the
        server sees the client go away)."""
        if self.ex is not None:
            self.ex.failed = True
            self.ex = None
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.draining = False
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()


class StreamPool:
    """Keep-alive connections to one origin (scheme, host, port), at most `limit` open (None:
    no limit); a request beyond it waits for one to be released."""

    def __init__(self, url: URL, headers: dict[str, str], limit: int | None) -> None:
        self.host = url.host or ""
        self.addresses: list[str] = []
        self.resolved_at = 0.0
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl_module.create_default_context() if url.scheme == "https" else None
        self.limit = limit
        # Made in the run's event loop (http.py), kept: asyncio.get_running_loop() is a system
        # call (getpid) on Python 3.11, and a request would make it on every send.
        self.loop = asyncio.get_running_loop()
        self.idle: collections.deque[StreamConnection] = collections.deque()
        self.open: set[StreamConnection] = set()
        # Connections whose request ended at [DONE] before the body did, with the time each
        # began draining (oldest first). Outside `open`: not held against the limit, so the
        # next request is not kept waiting on a body's end.
        self.draining: dict[StreamConnection, float] = {}
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.drain_waits_missed = 0
        self.heads: dict[str, bytes] = {}  # the request head up to Content-Length, by path
        netloc = self.host if ":" not in self.host else f"[{self.host}]"
        default_port = url.port is None or url.port == (443 if url.scheme == "https" else 80)
        self.host_header = netloc if default_port else f"{netloc}:{self.port}"
        lines = []
        for key, value in {"User-Agent": USER_AGENT, "Accept": "*/*", **headers}.items():
            if any(c in key + value for c in "\r\n\0") or ":" in key:
                raise UsageError(f"--header {key}: a header cannot hold a line break")
            lines.append(f"{key}: {value}\r\n")
        self.header_lines = "".join(lines)

    def head(self, url: URL) -> bytes:
        path = url.raw_path_qs
        head = self.heads.get(path)
        if head is None:
            head = self.heads[path] = (
                f"POST {path} HTTP/1.1\r\nHost: {self.host_header}\r\n{self.header_lines}"
                "Content-Length: "
            ).encode("latin-1")
        return head

    async def _resolve(self) -> list[str]:
        """The host's addresses, through the system resolver (socket.getaddrinfo, in a thread,
        as aiohttp's ThreadedResolver: the same answer under either event loop); kept for
        DNS_CACHE_S. An IP address resolves to itself."""
        now = time.monotonic()
        if self.addresses and now - self.resolved_at < DNS_CACHE_S:
            return self.addresses
        try:
            ipaddress.ip_address(self.host)
            found = [self.host]
        except ValueError:
            try:
                infos = await self.loop.run_in_executor(
                    None, partial(socket.getaddrinfo, self.host, self.port,
                                  type=socket.SOCK_STREAM))
            except socket.gaierror as e:
                raise HttpFailure(
                    "dns", f"cannot resolve {self.host!r}: {e.strerror or e}") from None
            found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        self.addresses, self.resolved_at = found, now
        return found

    async def _connect(self) -> StreamConnection:
        loop = self.loop
        error: BaseException | None = None
        for address in await self._resolve():
            try:
                _, conn = await loop.create_connection(
                    lambda: StreamConnection(self), address, self.port, ssl=self.ssl,
                    server_hostname=self.host if self.ssl is not None else None,
                )
            except (OSError, ssl_module.SSLError) as e:  # refused, unreachable, TLS
                error = e
                continue
            self.open.add(conn)
            return conn
        raise HttpFailure(
            "connect", f"cannot connect to {self.host}:{self.port} ({error})") from None

    async def acquire(self) -> StreamConnection:
        now = time.monotonic()
        if self.draining:
            self._expire_draining(now)
        while self.idle:
            conn = self.idle.pop()  # the most recently used: the likeliest still open
            if not conn.closed and now - conn.idle_since < KEEPALIVE_S:
                conn.reused = True
                return conn
            conn.close()
        at_limit = self.limit is not None and len(self.open) >= self.limit
        if self.draining and not at_limit and self.drain_waits_missed < DRAIN_WAITS_MISSED:
            got = await self._wait(DRAIN_WAIT_S)
            if got is not None and not got.closed:
                return got
            if got is None:
                self.drain_waits_missed += 1
        while self.limit is not None and len(self.open) >= self.limit:
            got = await self._wait(None)
            if got is not None and not got.closed:
                return got
        conn = await self._connect()
        conn.reused = False
        return conn

    async def _wait(self, timeout_s: float | None) -> StreamConnection | None:
        """The next connection released (drained, or freed under the limit), marked reused;
        None when one closed (its place in the limit is free: open one) or after timeout_s."""
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        timer = (None if timeout_s is None else
                 self.loop.call_later(timeout_s, _settle_none, waiter))
        try:
            conn = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                self.release(waiter.result())  # handed one as it was cancelled
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if conn is not None:
            conn.reused = True
        return conn

    def release(self, conn: StreamConnection) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def drain(self, conn: StreamConnection) -> None:
        """A connection's request ended at [DONE] before its body did: its place in the limit
        goes to a waiting request while it drains. (Drained, it rejoins the pool, which may
        then hold a connection past the limit: the next request takes it rather than open
        one. fd_limit.RESERVED_FDS is the headroom; draining lasts microseconds.)"""
        self.forget(conn)
        self.draining[conn] = time.monotonic()

    def drained(self, conn: StreamConnection) -> None:
        """The body after [DONE] ended: the connection serves again."""
        del self.draining[conn]
        self.open.add(conn)
        self.release(conn)

    def _expire_draining(self, now: float) -> None:
        """Closes the connections draining for DONE_DRAIN_S (oldest first)."""
        while self.draining:
            conn, since = next(iter(self.draining.items()))
            if now - since < DONE_DRAIN_S:
                break
            del self.draining[conn]
            conn.close()

    def forget(self, conn: StreamConnection) -> None:
        """A connection closed: its place in the limit goes to a waiting request."""
        self.draining.pop(conn, None)
        if conn in self.open:
            self.open.discard(conn)
            while self.waiters:
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # None: open a new connection
                    return

    async def post_stream(self, url: URL, body: bytes, stream: SseStream, t0: float) -> None:
        """POST `body` and feed the answer's events to `stream`; HttpFailure when the answer
        is not a complete event stream (the transport's failures included)."""
        data = self.head(url) + b"%d\r\n\r\n" % len(body) + body
        for attempt in (0, 1):
            conn = await self.acquire()
            ex = _Exchange(stream, t0, self.loop.create_future())
            conn.start(ex, data)
            stream.sent()
            try:
                await ex.done
            except _StaleConnection:
                if attempt:
                    raise HttpFailure(
                        "stream_cut", "connection closed before the answer (twice)") from None
                continue
            finally:
                if conn.ex is ex:  # still in progress: cancelled, or timed out
                    conn.abandon()
            if ex.streaming:
                return
            text = stream.error_text(bytes(ex.error_body or b""))
            if not 200 <= ex.status < 300:
                raise HttpFailure("http_status", f"HTTP {ex.status}: {text}")
            raise HttpFailure("bad_event", f"expected an event stream, got {ex.ctype}: {text}")

    def close(self) -> None:
        for conn in [*self.open, *self.draining]:
            conn.close()
        self.idle.clear()


def _settle_none(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
