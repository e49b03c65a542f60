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

import collections
import json

DEFAULT_READ_TIMEOUT_S = 15.0
# OpenAI's documented limit on the image payload of one request (50 MB): --max-image-bytes.
DEFAULT_MAX_IMAGE_BYTES = 50 * 1000 * 1000
DEFAULT_MAX_CONNECTIONS = 4096
MAX_HEAD_BYTES = 64 * 1024
# A head's bytes beyond its URL and header names and values: "METHOD ", " HTTP/1.1\r\n" and
# the blank line; ": " and "\r\n" per header (the counts are per request, give or take).
REQUEST_LINE_BYTES = 20
HEADER_LINE_BYTES = 4
# Connections beyond --max-connections being answered 503 at one time; each may take this long
# to send its request before the 503 is written anyway. The open-file limit keeps room for them.
OVERFLOW_RESERVE = 256
OVERFLOW_READ_TIMEOUT_S = 1.0


def _raw_response(status: str, message: str, code: str,
                  kind: str = "invalid_request_error") -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind,
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


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type:  # noqa: C901 - over 15 as merged from main; to split (issue 23)
    """An HttpToolsProtocol class with these limits (uvicorn.Config(http=...)). uvicorn is
    imported here, not at the top: every cbbench command imports this module's defaults."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    message = (f"the server has {max_connections} connections open, its limit "
               "(--max-connections): retry later")
    TOO_MANY_CONNECTIONS = _raw_response("503 Service Unavailable", message,
                                         "too_many_connections", "server_error")

    async def too_many(scope, receive, send) -> None:
        body = json.dumps({"error": {
            "message": message, "type": "server_error", "param": None,
            "code": "too_many_connections",
        }}).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()), (b"retry-after", b"1"),
        ]})
        await send({"type": "http.response.body", "body": body})

    # Connections beyond the cap waiting for their request to answer it 503, oldest first.
    waiting: collections.OrderedDict = collections.OrderedDict()

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _read_timer = None
        _head_done = False
        _head_bytes = 0  # of the request head in progress (it may span reads)
        _head_size = 0  # of its parsed parts (request line, headers)
        _consumed = 0  # bytes of the current read that finished heads and bodies took
        _began = False  # a request began in the current read
        _over = False  # beyond the cap: answered 503

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                # Beyond the cap a connection is answered, not kept: a stalled one held its
                # file descriptor for the whole read timeout, and enough of them exhausted the
                # file limit (clients then got resets, not the 503). Up to OVERFLOW_RESERVE
                # wait at most OVERFLOW_READ_TIMEOUT_S for their request; a newcomer beyond
                # those takes the place of the one that waited longest, which is answered 503
                # at once (it sent nothing, so it reads the answer, not a reset).
                self._over = True
                if len(waiting) >= OVERFLOW_RESERVE:
                    oldest, _ = waiting.popitem(last=False)
                    oldest._answer_busy()
                waiting[self] = None
                self.app = too_many  # answers this connection's request, then closes
            self._arm()

        def data_received(self, data: bytes) -> None:
            self._arm()  # the first byte of a kept-alive connection's next request
            self._consumed, self._began = 0, False
            super().data_received(data)
            if not self._head_done and self.transport is not None:
                # Per request, not per read: one read may carry many small pipelined
                # requests (more than 64 KiB of them got a spurious 431).
                rest = max(0, len(data) - self._consumed)
                self._head_bytes = rest if self._began else self._head_bytes + len(data)
                if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                    self.transport.write(HEAD_TOO_LARGE)
                    self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_done = False
            self._head_bytes = 0
            self._head_size = REQUEST_LINE_BYTES
            self._began = True

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._head_size += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._head_size += len(name) + len(value) + HEADER_LINE_BYTES

        def on_headers_complete(self) -> None:
            self._head_done = True
            waiting.pop(self, None)  # its request is in: the app answers it
            self._consumed += self._head_size
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            self._consumed += len(body)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()  # the request is in: the answer may take as long as it takes

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # the next request's first byte arms it again

        def connection_lost(self, exc) -> None:
            self._disarm()
            waiting.pop(self, None)
            super().connection_lost(exc)

        def _answer_busy(self) -> None:
            self._disarm()
            if self.transport is not None and not self.transport.is_closing():
                if not self._head_done:
                    self.transport.write(TOO_MANY_CONNECTIONS)
                self.transport.close()

        def _arm(self) -> None:
            if self._read_timer is None and (self.cycle is None or self.cycle.response_complete
                                             or not self._head_done):
                self._read_timer = self.loop.call_later(self._arm_after(), self._timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _arm_after(self) -> float:
            return min(read_timeout_s, OVERFLOW_READ_TIMEOUT_S) if self._over else read_timeout_s

        def _timed_out(self) -> None:
            self._read_timer = None
            if self.transport is None or self.transport.is_closing():
                return
            if not self._head_done:  # no app runs for it yet: answer, then hang up
                self.transport.write(TOO_MANY_CONNECTIONS if self._over else REQUEST_TIMEOUT)
            self.transport.close()  # an app reading the body sees a disconnect

    return GuardedHttpToolsProtocol
