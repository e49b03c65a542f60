"""A lean HTTP/1.1 client on asyncio streams, for the load generator's hot path.

Why not httpx: on the 2-core benchmark machine httpx spent ~800 us of CPU per streamed request
(its connection pool scans every connection on each request and release), against ~20 us for
plain asyncio streams; at 500 requests/s it fell behind and never caught up (see
results/loadgen_capacity.md). This client does only what the benchmark needs: keep-alive
connections (LIFO reuse, one retry when a reused connection turns out closed), one write per
request, chunked / Content-Length / close-delimited bodies read as lines, TLS for https.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
from urllib.parse import urlsplit

READ_LIMIT = 1 << 20  # the longest response head or line a StreamReader buffers
BODY_READ_BYTES = 1 << 16
USER_AGENT = "cbbench"


class HttpFailure(Exception):
    """A failed request, with the benchmark's error_type (connect, dns, bad_event, ...)."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type


class _Conn:
    __slots__ = ("reader", "writer", "reused")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer, self.reused = reader, writer, False

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()


def _parse_head(head: bytes) -> tuple[int, bool, dict[str, str]]:
    """(status, HTTP/1.1?, lower-cased headers) of a response head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpFailure("bad_event", f"malformed HTTP status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), parts[0] == "HTTP/1.1", headers


class Response:
    """A response whose body is read as it arrives: next_lines() for event streams, read()
    for small bodies. release() returns the connection to the pool when the body was read
    to its end, and closes it otherwise."""

    def __init__(self, client: HttpClient, conn: _Conn, head: bytes):
        self._client, self._conn = client, conn
        self.status, http11, self.headers = _parse_head(head)
        conn_hdr = self.headers.get("connection", "").lower()
        self._keep_alive = "close" not in conn_hdr if http11 else "keep-alive" in conn_hdr
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        self._left: int | None = None
        if not self._chunked and length is not None:
            if not length.isdigit():
                raise HttpFailure("bad_event", f"malformed Content-Length: {length[:40]!r}")
            self._left = int(length)
        elif not self._chunked:
            self._keep_alive = False  # the body ends when the server closes
        self._done = self._left == 0
        self._buf = b""
        self._released = False

    async def _next_piece(self) -> bytes | None:
        """The next piece of body as it came off the wire; None at its end."""
        if self._done:
            return None
        r = self._conn.reader
        if self._chunked:
            line = await r.readuntil(b"\r\n")
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise HttpFailure("bad_event", f"malformed chunk size {line[:40]!r}") from None
            if size == 0:
                while await r.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                    pass
                self._done = True
                return None
            return (await r.readexactly(size + 2))[:-2]
        if self._left is not None:
            data = await r.read(min(self._left, BODY_READ_BYTES))
            if not data:
                raise asyncio.IncompleteReadError(b"", self._left)
            self._left -= len(data)
            self._done = self._left == 0
            return data
        data = await r.read(BODY_READ_BYTES)
        self._done = not data
        return data or None

    async def next_lines(self) -> list[bytes] | None:
        """The complete lines (without the newline) of the next piece of body; None at the
        end. One call per network read, so a caller can timestamp what it gets."""
        while True:
            data = await self._next_piece()
            if data is None:
                if self._buf:
                    out, self._buf = [self._buf.rstrip(b"\r")], b""
                    return out
                return None
            if b"\n" in data:
                lines = (self._buf + data).split(b"\n")
                self._buf = lines.pop()
                return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
            self._buf += data

    async def read(self, limit: int) -> bytes:
        """Up to `limit` bytes of body (all of it when shorter)."""
        out = bytearray()
        while len(out) < limit:
            data = await self._next_piece()
            if data is None:
                break
            out += data
        return bytes(out[:limit])

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._client._give_back(self._conn, reuse=self._done and self._keep_alive)


class _Exchange:
    """`async with client.stream(...) as resp`: the response, released on exit."""

    __slots__ = ("_client", "_method", "_path", "_body", "_resp")

    def __init__(self, client: HttpClient, method: str, path: str, body: bytes):
        self._client, self._method, self._path, self._body = client, method, path, body
        self._resp: Response | None = None

    async def __aenter__(self) -> Response:
        self._resp = await self._client.request(self._method, self._path, self._body)
        return self._resp

    async def __aexit__(self, *exc) -> None:
        self._resp.release()


class HttpClient:
    """Keep-alive connections to one server (`base_url`: scheme, host, port, path prefix)."""

    def __init__(self, base_url: str, headers: dict[str, str], max_connections: int | None = None):
        parts = urlsplit(base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._ssl = ssl.create_default_context() if self._https else None
        self._prefix = parts.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        fixed = {
            "Host": f"{host}:{parts.port}" if parts.port else host,
            "User-Agent": USER_AGENT,
            "Accept": "*/*",
        }
        if parts.username:  # http://user:password@host
            cred = f"{parts.username}:{parts.password or ''}".encode()
            fixed["Authorization"] = "Basic " + base64.b64encode(cred).decode()
        fixed.update(headers)
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._closed = False

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._ssl,
                limit=READ_LIMIT,
                server_hostname=self._host if self._ssl else None,
            )
        except socket.gaierror as e:
            raise HttpFailure("dns", f"cannot resolve {self._host!r}: {e.strerror or e}") from None
        except ssl.SSLError as e:
            raise HttpFailure("connect", f"TLS handshake failed: {e}") from None
        except OSError as e:
            msg = e.strerror or str(e) or type(e).__name__
            raise HttpFailure(
                "connect", f"cannot connect to {self._host}:{self._port}: {msg}"
            ) from None
        return _Conn(reader, writer)

    async def _acquire(self, fresh: bool) -> _Conn:
        while self._idle and not fresh:
            conn = self._idle.pop()  # LIFO: the warmest connection
            if conn.usable():
                conn.reused = True
                return conn
            conn.writer.close()
        return await self._connect()

    def _give_back(self, conn: _Conn, reuse: bool) -> None:
        if reuse and not self._closed and conn.usable():
            self._idle.append(conn)
        else:
            conn.writer.close()
        if self._slots is not None:
            self._slots.release()

    def _request_head(self, method: str, path: str, body_len: int) -> bytes:
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode() + self._fixed
        if body_len or method == "POST":
            head += b"Content-Length: %d\r\n" % body_len
        return head + b"\r\n"

    async def request(self, method: str, path: str, body: bytes = b"") -> Response:
        """Send one request and read the response head; the caller must release() it."""
        if self._slots is not None:
            await self._slots.acquire()
        conn = None
        try:
            data = self._request_head(method, path, len(body)) + body
            for attempt in range(2):
                conn = await self._acquire(fresh=attempt > 0)
                try:
                    conn.writer.write(data)
                    await conn.writer.drain()
                    while True:
                        head = await conn.reader.readuntil(b"\r\n\r\n")
                        if not head.startswith(b"HTTP/1.1 1"):  # skip 100 Continue & co
                            break
                except (asyncio.IncompleteReadError, ConnectionError) as e:
                    conn.writer.close()
                    stale = conn.reused and not getattr(e, "partial", b"")
                    conn = None
                    if stale and attempt == 0:  # the server had closed the idle connection
                        continue
                    raise
                return Response(self, conn, head)
            raise AssertionError("unreachable")
        except BaseException:
            if conn is not None:
                conn.writer.close()
            if self._slots is not None:
                self._slots.release()
            raise

    def stream(self, method: str, path: str, body: bytes = b"") -> _Exchange:
        return _Exchange(self, method, path, body)

    async def get(self, path: str, limit: int, timeout_s: float) -> tuple[int, bytes]:
        """(status, body up to `limit` bytes) of a small GET."""

        async def go() -> tuple[int, bytes]:
            async with self.stream("GET", path) as resp:
                return resp.status, await resp.read(limit)

        return await asyncio.wait_for(go(), timeout_s)

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().writer.close()


def classify(e: BaseException) -> tuple[str, str]:
    """(error_type, message) for an exception out of a request."""
    if isinstance(e, HttpFailure):
        return e.error_type, str(e)
    if isinstance(e, asyncio.TimeoutError):
        return "timeout", "timed out"
    if isinstance(e, asyncio.IncompleteReadError):
        return "stream_cut", f"connection closed mid-response ({len(e.partial)} bytes of a part)"
    if isinstance(e, asyncio.LimitOverrunError):
        return "bad_event", f"response line longer than {READ_LIMIT} bytes"
    if isinstance(e, (ConnectionError, OSError)):
        return "stream_cut", f"{type(e).__name__}: {e.strerror or e}"
    return "client_error", f"{type(e).__name__}: {e}"
