"""Answers a server may send that stream_pool.py read wrong (/tmp/hostile-http's repro, its exact
bytes): junk after a complete response poisoned the next request on that pooled connection
(`bad_event: malformed response` for an answer the server gave right); a 1xx interim response
(103 Early Hints, 100 Continue) failed the request as `HTTP 103`; `Content-Type:
Text/Event-Stream` failed every request; a stream that sent `data: [DONE]` and never ended its
chunked body timed out with all its tokens; a UTF-8 BOM before the first event dropped that
event's token. Each server here is FakeOpenAI answering the streams with one mode's bytes."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import numpy as np
import pytest
from fake_openai import MODEL, FakeOpenAI, endpoint_options, prompt_requests
from helpers import invoke_app
from yarl import URL

from cbbench.targets import stream_pool
from cbbench.targets.http import run_http
from cbbench.targets.request import RequestContext, exchange
from cbbench.targets.sse import SseStream
from cbbench.targets.transport import HttpFailure

TOKENS = 3
BOM = b"\xef\xbb\xbf"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
END = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _events(n: int, chat: bool) -> list[bytes]:
    """n one-token events (the last with finish_reason), the usage, [DONE]: SSE bytes."""
    out = []
    for i in range(n):
        finish = "length" if i == n - 1 else None
        choice = ({"index": 0, "delta": {"content": " a"}, "finish_reason": finish} if chat
                  else {"index": 0, "text": " a", "finish_reason": finish})
        out.append(b"data: " + json.dumps({"id": "cmpl-x", "choices": [choice]}).encode()
                   + b"\n\n")
    usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
    out.append(b"data: " + json.dumps({"id": "cmpl-x", "choices": [], "usage": usage}).encode()
               + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


class Hostile(FakeOpenAI):
    """FakeOpenAI whose every stream is answered with `mode`'s bytes (GET /v1/models stays)."""

    def __init__(self, mode: str):
        super().__init__(metrics=False)
        self.mode = mode
        self.readers: dict = {}  # by writer: donehold reads on to the client's close
        self.stream_writers: set = set()  # the connections that carried a stream

    async def _stream(self, req: dict, chat: bool, writer) -> bool:
        self.stream_writers.add(writer)
        evs = _events(req["max_tokens"], chat)
        mode = self.mode
        if mode in ("junk", "unasked"):  # Content-Length right, then bytes past the response
            body = b"".join(evs)
            # unasked: a second response's head, its body never sent: the next answer's
            # first bytes would be read as that body.
            after = b"GARBAGE\r\n\r\n" if mode == "junk" else (
                b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Content-Length: %d\r\n\r\n%s%s" % (len(body), body, after))
            return True
        if mode == "donehold":  # [DONE], then the chunked body never ends
            writer.write(HEAD % b"text/event-stream" + b"".join(_chunk(e) for e in evs))
            await writer.drain()
            reader = self.readers[writer]
            while await reader.read(1 << 16):  # until the client closes the connection
                pass
            return False
        head = {
            "continue100": b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD % b"text/event-stream",
            # The interim answer's headers are not the final one's: this 200 has no type.
            "hints103": b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\nContent-Type: text/html\r\n"
                        b"\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "upper": HEAD % b"Text/Event-Stream",
            "upperparams": HEAD % b"TEXT/EVENT-STREAM; Charset=UTF-8",
            "json": HEAD % b"application/json",
            "bom": HEAD % b"text/event-stream",
        }[mode]
        if mode == "bom":
            evs[0] = BOM + evs[0]
        writer.write(head + b"".join(_chunk(e) for e in evs) + END)
        return True

    async def _handle(self, reader, writer) -> None:
        self.readers[writer] = reader
        await super()._handle(reader, writer)


def _run(server: Hostile, n: int, **kw):
    wreqs = prompt_requests([f"r{i}" for i in range(n)], output_len=TOKENS)
    return run_http(endpoint_options(server.url, **kw), wreqs, np.zeros(n))


def _cli(url: str, out, n: int, *extra):
    return invoke_app([
        "run", "--endpoint", url, "--served-model", MODEL, "--workload", "random",
        "--input-len", "8", "--output-len", str(TOKENS), "--num-requests", str(n),
        "--request-rate", "50", "--max-concurrency", "1", "--max-error-rate", "1",
        "--save-detailed", "--output", str(out), *extra,
    ])


def _requests(out) -> list[dict]:
    return json.loads(out.read_text())["requests"]


class _Transport:
    def __init__(self):
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _pooled_connection() -> tuple[stream_pool.StreamPool, stream_pool.StreamConnection,
                                  stream_pool._Exchange]:
    """A pool (port 9: a new connection is refused) holding one open connection that reads
    a request's answer; made inside a running loop."""
    pool = stream_pool.StreamPool(URL("http://127.0.0.1:9"), {}, None)
    conn = stream_pool.StreamConnection(pool)
    conn.transport = _Transport()  # type: ignore[assignment]
    pool.open.add(conn)
    conn.ex = ex = stream_pool._Exchange(SseStream(False, []), 0.0, pool.loop.create_future())
    return pool, conn, ex


STREAM = HEAD % b"text/event-stream" + b"".join(_chunk(e) for e in _events(TOKENS, False))


async def _through_aiohttp(url: str) -> SseStream:
    """One completions stream through request.exchange without a StreamPool (the streams
    through the aiohttp session: RequestContext.pool None)."""
    async with aiohttp.ClientSession() as session:
        ctx = RequestContext(session=session, url=URL(url + "/v1/completions"),
                             t0=time.perf_counter(), timeout_s=5.0, payload={}, chat=False)
        st = SseStream(False, [])
        body = b'{"prompt":"x","max_tokens":%d}' % TOKENS
        await asyncio.wait_for(exchange(ctx, body, st), 10.0)
        return st


# ---- 1: bytes past a complete response ---------------------------------------------------
@pytest.mark.parametrize("mode", ["junk", "unasked"])
def test_bytes_past_a_response_do_not_poison_the_next_request(tmp_path, mode):
    # One request at a time: each would reuse the one before's connection. Junk after the
    # response (or a response nobody asked for) made request 1 fail `bad_event: malformed
    # response: Expected HTTP/...` (or read that stray response as its own answer).
    n = 3
    with Hostile(mode) as s:
        out = tmp_path / "r.json"
        res = _cli(s.url, out, n)
        connections = len(s.stream_writers)
    assert res.exit_code == 0, (res.output, res.exception)
    reqs = _requests(out)
    assert [(r["error_type"], r["output_tokens"]) for r in reqs] == [(None, TOKENS)] * n
    # The connection that held the junk is closed, never reused: each request a fresh one.
    assert connections == n


@pytest.mark.parametrize(("after", "reused"), [
    (b"", True), (b"\r\n", True),  # a blank line between responses: llhttp skips it
    (b"GARBAGE\r\n\r\n", False), (b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n", False),
])
def test_a_connection_is_pooled_only_with_nothing_after_its_answer(after, reused):
    async def go():
        pool, conn, ex = _pooled_connection()
        conn.data_received(STREAM + END + after)
        assert ex.done.done() and len(ex.stream.times) == TOKENS
        assert (conn in pool.idle) == reused and conn.closed != reused

    asyncio.run(go())


# ---- 2: 1xx interim responses ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["continue100", "hints103"])
def test_an_interim_response_is_skipped_for_the_final_one(mode):
    with Hostile(mode) as s:
        run = _run(s, 3, max_concurrency=1)
        connections = len(s.stream_writers)
    assert [r.error for r in run.records] == [None] * 3  # was "HTTP 103: " / "HTTP 100: "
    assert [len(r.token_times_s) for r in run.records] == [TOKENS] * 3
    assert connections == 1  # the answer ended cleanly: the connection serves the next one


# ---- 3: the media type's case ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["upper", "upperparams"])
def test_the_event_streams_media_type_is_read_case_insensitively(mode):
    with Hostile(mode) as s:
        run = _run(s, 2)
    assert [r.error for r in run.records] == [None, None]  # was "expected an event stream"
    assert [len(r.token_times_s) for r in run.records] == [TOKENS, TOKENS]


def test_another_media_type_is_still_not_an_event_stream():
    with Hostile("json") as s:
        run = _run(s, 1)
    assert run.records[0].error_type == "bad_event"
    assert "expected an event stream, got application/json" in run.records[0].error


@pytest.mark.parametrize("mode", ["upper", "json"])
def test_the_aiohttp_path_reads_the_media_type_as_the_pool_does(mode):
    with Hostile(mode) as s:
        if mode == "json":
            with pytest.raises(HttpFailure, match="expected an event stream"):
                asyncio.run(_through_aiohttp(s.url))
            return
        st = asyncio.run(_through_aiohttp(s.url))
    assert len(st.times) == TOKENS


# ---- 4: [DONE] on a body that never ends --------------------------------------------------
def test_done_ends_the_request_though_the_body_never_ends(tmp_path):
    # The server sends every event and [DONE] but never the chunked body's end: each request
    # timed out after the whole --request-timeout with all its tokens.
    n, timeout_s = 3, 20.0
    with Hostile("donehold") as s:
        out = tmp_path / "r.json"
        t = time.perf_counter()
        res = _cli(s.url, out, n, "--request-timeout", str(timeout_s))
        took = time.perf_counter() - t
        connections = len(s.stream_writers)
    assert res.exit_code == 0, (res.output, res.exception)
    assert took < timeout_s  # not one request waited its timeout out
    reqs = _requests(out)
    assert [(r["error_type"], r["output_tokens"]) for r in reqs] == [(None, TOKENS)] * n
    assert all(r["e2el_ms"] is not None and r["e2el_ms"] < timeout_s * 1e3 for r in reqs)
    # The unfinished body's connection is not reused: each request opened its own.
    assert connections == n


@pytest.mark.parametrize("after", [END, _chunk(b"data: more\n\n") + END, b"GARBAGE\r\n\r\n",
                                   END + b"HTTP/1.1 200 OK\r\n"])
def test_done_ends_the_request_at_its_read_and_the_body_after_it_decides_reuse(after):
    # The usual server's last two writes ([DONE], then the body's end) may come in two reads:
    # the request ends at the first, and the connection serves again once its body ended
    # cleanly (what the body held past [DONE] is not the request's); a parse error or bytes
    # past the body's end close it.
    async def go():
        pool, conn, ex = _pooled_connection()
        conn.data_received(STREAM)
        assert ex.done.done() and ex.done.exception() is None  # ended at [DONE]'s read
        assert len(ex.stream.times) == TOKENS
        assert conn in pool.draining and conn not in pool.open and conn not in pool.idle
        conn.data_received(after)
        if after.endswith(END):
            assert conn in pool.open and not pool.draining
            assert await pool.acquire() is conn  # the next request's connection
        else:
            assert conn.closed and conn.transport.closed and not pool.draining
            with pytest.raises(HttpFailure):  # not reused: a new connection (refused)
                await pool.acquire()

    asyncio.run(go())


def test_the_next_request_waits_for_a_draining_connection_rather_than_open_one():
    # [DONE] and the body's end came in two reads (the usual server's last two writes), and
    # the next request was sent between them: it opened a second connection (a handshake on
    # its send path) where the first was microseconds from free. One request in flight at a
    # time against the fake server read 2 connections for 10 requests in 3 of 8 runs.
    async def go():
        pool, conn, ex = _pooled_connection()
        conn.data_received(STREAM)
        assert ex.done.done() and conn in pool.draining
        nxt = asyncio.ensure_future(pool.acquire())  # port 9: a new connection is refused
        await asyncio.sleep(0)  # the acquire runs up to its wait for the drain
        assert not nxt.done()
        conn.data_received(END)
        assert await nxt is conn and conn.reused

    asyncio.run(go())


def test_a_drain_that_does_not_end_soon_is_not_waited_for(monkeypatch):
    # The wait for a draining connection is bounded (DRAIN_WAIT_S): past it, the request
    # opens its own connection, as it did before the wait.
    monkeypatch.setattr(stream_pool, "DRAIN_WAIT_S", 0.0)

    async def go():
        pool, conn, ex = _pooled_connection()
        conn.data_received(STREAM)
        assert ex.done.done() and conn in pool.draining
        with pytest.raises(HttpFailure, match="cannot connect"):  # it went to connect
            await asyncio.wait_for(pool.acquire(), 5.0)
        assert conn in pool.draining and not conn.closed  # still draining, not closed

    asyncio.run(go())


def test_a_body_still_open_past_the_drain_bound_is_closed(monkeypatch):
    # A connection that drains after [DONE] is closed once DONE_DRAIN_S passed (at the next
    # request's acquire), so a server that never ends its bodies holds no connections.
    monkeypatch.setattr(stream_pool, "DONE_DRAIN_S", 0.0)

    async def go():
        pool, conn, ex = _pooled_connection()
        conn.data_received(STREAM)
        assert ex.done.done() and conn in pool.draining
        with pytest.raises(HttpFailure):  # port 9: the new connection is refused
            await pool.acquire()
        assert conn.closed and conn.transport.closed and not pool.draining

    asyncio.run(go())


def test_the_aiohttp_path_ends_at_done_too():
    with Hostile("donehold") as s:  # it waited for a body's end that never came
        st = asyncio.run(_through_aiohttp(s.url))
    assert len(st.times) == TOKENS and st.done


# ---- 5: a byte-order mark before the first event ------------------------------------------
def test_a_bom_before_the_first_event_keeps_its_token():
    with Hostile("bom") as s:
        run = _run(s, 2)
    # The first event's token was dropped (2 of 3 counted, TTFT at the second event).
    assert [len(r.token_times_s) for r in run.records] == [TOKENS, TOKENS]
    assert [r.error for r in run.records] == [None, None]


@pytest.mark.parametrize("reads", [
    [BOM + b'data: {"choices":[{"text":"a"}]}\n\n'],
    [BOM, b'data: {"choices":[{"text":"a"}]}\n\n'],  # the BOM a read of its own
    [BOM[:2], BOM[2:] + b'data: {"choices":[{"text":"a"}]}\n\n'],  # cut inside it
    [BOM + b'data: {"choices":[{"text":"a"}]}\n', b"\n"],
])
def test_one_leading_bom_is_stripped(reads):
    st = SseStream(False, [])
    for k, r in enumerate(reads):
        st.feed(r, 0.1 * (k + 1))
    st.feed(b'data: {"choices":[{"text":"b","finish_reason":"length"}]}\n\ndata: [DONE]\n\n', 1.0)
    st.close(1.0)
    assert len(st.times) == 2 and st.times[0] < 1.0


def test_a_bom_past_the_streams_start_is_not_stripped():
    # The event-stream spec strips one BOM at the stream's start only: later, the line's
    # field name is "\ufeffdata", not "data" (the event is ignored).
    st = SseStream(False, [])
    st.feed(b'data: {"choices":[{"text":"a"}]}\n\n', 0.1)
    st.feed(BOM + b'data: {"choices":[{"text":"b"}]}\n\n', 0.2)
    assert st.times == [0.1]
    twice = SseStream(False, [])  # one BOM: a second is the first line's
    twice.feed(BOM + BOM + b'data: {"choices":[{"text":"a"}]}\n\n', 0.1)
    assert twice.times == []


# ---- a response head that never ends ---------------------------------------------------------
def test_a_response_head_past_its_bound_fails_the_request_and_closes_the_connection():
    """A header of 400 MB grew the client's memory until the request timed out (httptools keeps
    a header whole until its end). Past MAX_RESPONSE_HEAD_BYTES the request fails bad_event and
    the connection is closed, however the head is split across reads; a head under the bound
    still reads as before."""
    bound = stream_pool.MAX_RESPONSE_HEAD_BYTES
    read = 8 * 1024

    async def go():
        pool, conn, ex = _pooled_connection()
        conn.data_received(b"HTTP/1.1 200 OK\r\nX-Big: ")
        fed = 0
        while not ex.done.done() and fed < 4 * bound:
            conn.data_received(b"a" * read)
            fed += read
        assert ex.done.done() and fed <= bound + read, fed
        with pytest.raises(HttpFailure, match=f"its head is over {bound} bytes") as e:
            ex.done.result()
        assert e.value.error_type == "bad_event"
        assert conn.closed and conn not in pool.idle

        pool, conn, ex = _pooled_connection()  # a large head under the bound: read as before
        big = b"X-Pad: " + b"b" * (bound // 2) + b"\r\n"
        conn.data_received(STREAM.replace(b"\r\n\r\n", b"\r\n" + big + b"\r\n", 1) + END)
        assert ex.done.done() and ex.done.exception() is None
        assert len(ex.stream.times) == TOKENS

    asyncio.run(go())
