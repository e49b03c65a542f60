"""stream_pool.py's reading of a response held to h11's (a careful HTTP/1.1 client state
machine, the parser under httpx and the OpenAI SDK): the same server bytes, cut into reads at
points hypothesis draws, give the same status, the same body, and the same verdict (the answer
ended, or it did not). Where h11 refuses a response, the pool must not read it as a good answer.
The hostile-server rounds (test_stream_pool_hostile.py) cover junk after an answer, interim
answers, the media type's case, [DONE] on an open body and the BOM; here: the framings of
RFC 9112 section 6 and the head's line forms."""

from __future__ import annotations

import asyncio

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from cbbench.targets import stream_pool

SSE = b'data: {"choices":[{"text":"a","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'
EV = b"Content-Type: text/event-stream\r\n"


def _chunked(*parts: bytes, size: bytes = b"%x") -> bytes:
    return b"".join(size % len(p) + b"\r\n" + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


# (name, the server's bytes, whether it closes the connection after them)
AGREED = [
    ("content-length", b"HTTP/1.1 200 OK\r\n" + EV + b"Content-Length: %d\r\n\r\n" % len(SSE)
     + SSE, False),
    ("chunked-upper-hex-ext-trailer", b"HTTP/1.1 200 OK\r\n" + EV
     + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(SSE[:40], SSE[40:], size=b"%X;x=1")[:-2]
     + b"X-Trailer: 1\r\n\r\n", False),
    ("100-continue", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n" + EV
     + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(SSE), False),
    ("http10-to-close", b"HTTP/1.0 200 OK\r\n" + EV + b"\r\n" + SSE, True),
    ("connection-close", b"HTTP/1.1 200 OK\r\n" + EV + b"Connection: close\r\n"
     b"Content-Length: %d\r\n\r\n" % len(SSE) + SSE, True),
    # An error answer whose body runs to the close (RFC 9112 section 6.3 rule 8; Python's
    # http.server answers so): it ended at the close, it was not cut.
    ("error-to-close", b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
     b"Connection: close\r\n\r\nboom", True),
    ("http10-error-to-close", b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy", True),
    ("no-content", b"HTTP/1.1 204 No Content\r\n" + EV + b"\r\n", False),
    # Line forms h11 and aiohttp's client (vLLM's and AIPerf's benchmarks) both read: a head
    # whose lines end in a bare LF (RFC 9112 section 2.2), a folded header (section 5.2: a
    # user agent MUST unfold it), spaces after a chunk's size.
    ("bare-lf-head", b"HTTP/1.1 200 OK\nContent-Type: text/event-stream\n"
     b"Content-Length: %d\n\n" % len(SSE) + SSE, False),
    ("obs-fold", b"HTTP/1.1 200 OK\r\n" + EV + b"X-Note: a\r\n b\r\nContent-Length: %d\r\n\r\n"
     % len(SSE) + SSE, False),
    ("chunk-size-spaces", b"HTTP/1.1 200 OK\r\n" + EV + b"Transfer-Encoding: chunked\r\n\r\n"
     + _chunked(SSE, size=b"%x  "), False),
]
REFUSED = [  # h11 refuses these: the pool must not take them for a good answer
    ("chunked-cut", b"HTTP/1.1 200 OK\r\n" + EV + b"Transfer-Encoding: chunked\r\n\r\n"
     + _chunked(SSE)[:-5], True),
    ("content-length-short", b"HTTP/1.1 200 OK\r\n" + EV + b"Content-Length: %d\r\n\r\n"
     % (len(SSE) + 9) + SSE, True),
    ("conflicting-lengths", b"HTTP/1.1 200 OK\r\n" + EV + b"Content-Length: 5\r\n"
     b"Content-Length: 6\r\n\r\n" + SSE[:6], True),
    ("bad-chunk-footer", b"HTTP/1.1 200 OK\r\n" + EV + b"Transfer-Encoding: chunked\r\n\r\n"
     + b"%x\r\n" % len(SSE) + SSE + b"XX0\r\n\r\n", True),
    ("bad-status-line", b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n", True),
]


class _Body:
    """A stream that keeps the body's bytes (SseStream's interface, as the pool uses it)."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.done = False

    def feed(self, piece: bytes, t: float) -> None:
        self.body += piece

    def close(self, t: float) -> None:
        pass

    @staticmethod
    def error_text(body: bytes) -> str:
        return body.decode("latin-1")


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def _ours(reads: list[bytes], closes: bool) -> tuple[int | None, bytes, bool]:
    """(status, body, ended) as the pool reads the answer (None: no final head)."""
    async def go():
        pool = stream_pool.StreamPool(URL("http://127.0.0.1:9"), {}, None)
        conn = stream_pool.StreamConnection(pool)
        conn.transport = _Transport()  # type: ignore[assignment]
        pool.open.add(conn)
        body = _Body()
        conn.ex = ex = stream_pool._Exchange(body, 0.0, pool.loop.create_future())  # type: ignore[arg-type]
        for r in reads:
            if ex.done.done():
                break
            conn.data_received(r)
        if closes and not ex.done.done():
            conn.connection_lost(None)
        ended = ex.done.done() and ex.done.exception() is None
        got = bytes(body.body) if ex.streaming else bytes(ex.error_body or b"")
        return ex.status or None, got, ended

    return asyncio.run(go())


def _h11(data: bytes, closes: bool) -> tuple[int | None, bytes, bool]:
    """(status, body, ended) as h11 reads the answer to the same POST; ended False where it
    refuses the bytes."""
    c = h11.Connection(our_role=h11.CLIENT)
    c.send(h11.Request(method="POST", target="/v1/completions",
                       headers=[("Host", "x"), ("Content-Length", "2")]))
    c.send(h11.Data(data=b"{}"))
    c.send(h11.EndOfMessage())
    status, body = None, bytearray()
    try:
        c.receive_data(data)
        if closes:
            c.receive_data(b"")
        while (ev := c.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(ev, h11.Response):
                status = ev.status_code
            elif isinstance(ev, h11.Data):
                body += ev.data
            elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, bytes(body), isinstance(ev, h11.EndOfMessage)
    except h11.RemoteProtocolError:
        pass
    return status, bytes(body), False


def _splits(data: bytes):
    """The bytes cut into reads at drawn points (every byte boundary is a candidate)."""
    return st.lists(st.integers(0, len(data)), max_size=6).map(
        lambda cuts: [data[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)])
                      if b > a])


@pytest.mark.parametrize(("name", "raw", "closes"), AGREED, ids=[c[0] for c in AGREED])
@settings(max_examples=15)
@given(draw=st.data())
def test_the_pool_reads_each_answer_as_h11_does_however_it_is_split(name, raw, closes, draw):
    theirs = _h11(raw, closes)
    assert theirs[2], theirs  # h11 reads it as a complete answer
    reads = draw.draw(_splits(raw))
    assert _ours(reads, closes) == theirs


@pytest.mark.parametrize(("name", "raw", "closes"), REFUSED, ids=[c[0] for c in REFUSED])
@settings(max_examples=10)
@given(draw=st.data())
def test_what_h11_refuses_is_no_good_answer(name, raw, closes, draw):
    assert not _h11(raw, closes)[2]
    assert not _ours(draw.draw(_splits(raw)), closes)[2]
