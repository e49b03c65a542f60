"""The protocol class behind `cbbench serve`'s connection limits (cbbench/server/limits.py says
what the limits are and why). This module imports uvicorn at its top, so only the server
imports it: limits.guarded_protocol builds a subclass bound to one server's limits.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cbbench.server.protocol import error_body, send_json


@dataclass(frozen=True)
class ConnectionLimits:
    """One server's limits and the canned answers that enforce them."""

    read_timeout_s: float
    max_connections: int
    max_head_bytes: int
    request_line_bytes: int
    header_line_bytes: int
    overflow_reserve: int
    overflow_read_timeout_s: float
    too_many_message: str
    request_timeout: bytes  # the raw 408
    head_too_large: bytes  # the raw 431
    too_many_connections: bytes  # the raw 503, for a connection that sent no request
    # Connections beyond the cap waiting for their request to answer it 503, oldest first.
    waiting: collections.OrderedDict = field(default_factory=collections.OrderedDict)

    async def too_many_app(self, scope, receive, send) -> None:
        """The ASGI app of a connection beyond the cap: its request gets the 503."""
        await send_json(send, 503, error_body(self.too_many_message, "server_error",
                                              code="too_many_connections"),
                        [(b"connection", b"close"), (b"retry-after", b"1")])


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a read timeout, a head-size cap and a connection cap; a subclass
    sets ``_guard`` (limits.guarded_protocol)."""

    _guard: ConnectionLimits
    _read_timer = None
    _head_done = False
    _head_bytes = 0  # of the request head in progress (it may span reads)
    _head_size = 0  # of its parsed parts (request line, headers)
    _consumed = 0  # bytes of the current read that finished heads and bodies took
    _began = False  # a request began in the current read
    _over = False  # beyond the cap: answered 503

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self._guard.max_connections:
            self._overflow()
        self._arm()

    def _overflow(self) -> None:
        # Beyond the cap a connection is answered, not kept: a stalled one held its file
        # descriptor for the whole read timeout, and enough of them exhausted the file limit
        # (clients then got resets, not the 503). Up to overflow_reserve wait at most
        # overflow_read_timeout_s for their request; a newcomer beyond those takes the place
        # of the one that waited longest, which is answered 503 at once (it sent nothing, so
        # it reads the answer, not a reset).
        guard = self._guard
        self._over = True
        if len(guard.waiting) >= guard.overflow_reserve:
            oldest, _ = guard.waiting.popitem(last=False)
            oldest._answer_busy()
        guard.waiting[self] = None
        self.app = guard.too_many_app  # answers this connection's request, then closes

    def data_received(self, data: bytes) -> None:
        self._arm()  # the first byte of a kept-alive connection's next request
        self._consumed, self._began = 0, False
        super().data_received(data)
        if not self._head_done and self.transport is not None:
            self._check_head_size(len(data))

    def _check_head_size(self, read: int) -> None:
        # Per request, not per read: one read may carry many small pipelined requests (more
        # than 64 KiB of them got a spurious 431).
        rest = max(0, read - self._consumed)
        self._head_bytes = rest if self._began else self._head_bytes + read
        if self._head_bytes > self._guard.max_head_bytes and not self.transport.is_closing():
            self.transport.write(self._guard.head_too_large)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_done = False
        self._head_bytes = 0
        self._head_size = self._guard.request_line_bytes
        self._began = True

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head_size += len(name) + len(value) + self._guard.header_line_bytes

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._guard.waiting.pop(self, None)  # its request is in: the app answers it
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
        self._guard.waiting.pop(self, None)
        super().connection_lost(exc)

    def _answer_busy(self) -> None:
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            if not self._head_done:
                self.transport.write(self._guard.too_many_connections)
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
        guard = self._guard
        return min(guard.read_timeout_s, guard.overflow_read_timeout_s) if self._over \
            else guard.read_timeout_s

    def _timed_out(self) -> None:
        self._read_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if not self._head_done:  # no app runs for it yet: answer, then hang up
            guard = self._guard
            self.transport.write(guard.too_many_connections if self._over
                                 else guard.request_timeout)
        self.transport.close()  # an app reading the body sees a disconnect
