"""Connection limits for `cbbench serve`: uvicorn's httptools protocol with a read timeout, a
cap on a request head's size, and a cap on open connections.

uvicorn times out idle keep-alive connections only after a response; a client that connects
and sends half a request (or nothing) was held forever, and a few hundred of them exhausted the
file limit. Here every request must arrive whole (head and body) within the read timeout of
its first byte (of the connection, for the first one): else 408 (while no response started)
and the connection is closed. The read timeout covers reading a request, never the answer: a
long stream is not cut. A head larger than MAX_HEAD_BYTES is refused with 431 (the parser sets
no limit of its own), and a connection beyond the cap gets a 503 in the OpenAI error shape.
"""

from __future__ import annotations

import json

DEFAULT_READ_TIMEOUT_S = 15.0
DEFAULT_MAX_CONNECTIONS = 4096
MAX_HEAD_BYTES = 64 * 1024


def _raw_response(status: str, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


REQUEST_TIMEOUT = _raw_response(
    "408 Request Timeout", "the request did not arrive whole within --read-timeout",
    "request_timeout",
)
HEAD_TOO_LARGE = _raw_response(
    "431 Request Header Fields Too Large",
    f"the request head is larger than {MAX_HEAD_BYTES} bytes", "request_head_too_large",
)


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type:
    """An HttpToolsProtocol class with these limits (uvicorn.Config(http=...)). uvicorn is
    imported here, not at the top: every cbbench command imports this module's defaults."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return type("GuardedHttpToolsProtocol", (_Guarded, HttpToolsProtocol), {
        "read_timeout_s": read_timeout_s, "max_connections": max_connections,
    })


def _too_many(max_connections: int):
    async def too_many(scope, receive, send) -> None:
        body = json.dumps({"error": {
            "message": f"the server has {max_connections} connections open, its limit "
                       "(--max-connections): retry later",
            "type": "server_error", "param": None, "code": "too_many_connections",
        }}).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()), (b"retry-after", b"1"),
        ]})
        await send({"type": "http.response.body", "body": body})

    return too_many


class _Guarded:
    """Mixed in front of uvicorn's HttpToolsProtocol: the read timeout, the head size limit
    and the connection cap (the class attributes guarded_protocol sets)."""

    read_timeout_s: float
    max_connections: int
    _read_timer = None
    _head_done = False
    _head_bytes = 0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            # Answers this connection's request, then closes it.
            self.app = _too_many(self.max_connections)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._arm()  # the first byte of a kept-alive connection's next request
        super().data_received(data)
        if not self._head_done and self.transport is not None:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.transport.write(HEAD_TOO_LARGE)
                self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_done = False
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_done = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()  # the request is in: the answer may take as long as it takes

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # the next request's first byte arms it again

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._read_timer is None and (self.cycle is None or self.cycle.response_complete
                                         or not self._head_done):
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _timed_out(self) -> None:
        self._read_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if not self._head_done:  # no app runs for it yet: answer, then hang up
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()  # an app reading the body sees a disconnect
