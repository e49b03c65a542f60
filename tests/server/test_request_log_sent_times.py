"""`cbbench serve --request-log`: no logged send time is later than the client's receipt.

The log stamped an event "sent" after ``await send(...)`` returned; the bytes were in the
transport inside that call, and the coroutine resumed only when the event loop (and the GIL,
which the sim engine's thread may hold for a 5 ms switch interval) got back to it: events read
as written up to ~6 ms after the client had them. Here the app is driven in-process through an
ASGI ``send`` that notes when each body is handed to it (the earliest a client can have those
bytes) and then holds the coroutine for HOLD_S before returning, as a busy GIL does. Nothing
depends on the machine's speed: a stamp taken after the await is at least HOLD_S late; one
taken at the hand-over is never later than the receipt.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers import SERVE_MODEL, sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig

HOLD_S = 0.02  # how long each send's await holds the coroutine after the hand-over
RESPONSE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "requests.jsonl"
    run = start_server(lambda: build_serving_engine(sim_options()),
                       ServeConfig(request_log=str(log)))
    traces: list = []
    request_log = run.app.state.request_log
    write = request_log.write
    request_log.write = lambda trace: (traces.append(trace), write(trace))  # perf-clock times
    yield run, traces
    run.stop()


def _exchange(run, path: str, body: dict) -> list[tuple[float, bytes]]:
    """POST ``body`` to the app in-process on the server's own event loop; the (time handed
    over, bytes) of every response body message."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode())],
    }
    sent_body = False
    bodies: list[tuple[float, bytes]] = []

    async def receive():
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client stays: the disconnect watcher waits on
        raise AssertionError("unreachable")

    async def send(message):
        if message["type"] == "http.response.body":
            bodies.append((time.perf_counter(), message.get("body", b"")))
        await asyncio.sleep(HOLD_S)  # the await resumes late, as with the GIL held elsewhere

    loop = run.engine._loop
    asyncio.run_coroutine_threadsafe(run.app(scope, receive, send), loop).result(
        RESPONSE_TIMEOUT_S)
    return bodies


def _trace(traces: list, kind: str):
    deadline = time.monotonic() + RESPONSE_TIMEOUT_S
    while time.monotonic() < deadline:
        found = [t for t in traces if t.api == kind]
        if found:
            return found[-1]
        time.sleep(0.01)
    raise AssertionError(f"no {kind} trace")


def test_no_streamed_event_is_logged_after_the_client_had_it(served):
    run, traces = served
    n = 6
    bodies = _exchange(run, "/v1/completions", {
        "model": SERVE_MODEL, "prompt": "one two three four", "max_tokens": n,
        "ignore_eos": True, "stream": True})
    trace = _trace(traces, "completions")
    events = trace.events
    assert sum(k for _, k, _ in events) == n
    # The bodies: any opening, one per event, and the closing one (finish, usage, [DONE]).
    token_bodies = bodies[len(bodies) - 1 - len(events):-1]
    assert all(b'"text"' in b for _, b in token_bodies)
    for (logged, _, _), (received, _) in zip(events, token_bodies, strict=True):
        assert logged <= received, (logged, received)  # was logged >= received + HOLD_S
    for (logged, _, _), (before, _) in zip(events[1:], token_bodies, strict=False):
        assert logged > before  # each event is stamped at its own body, not an earlier one
    assert trace.first_token_sent == events[0][0] and trace.last_token_sent == events[-1][0]


def test_a_whole_body_is_logged_sent_no_later_than_the_client_had_it(served):
    run, traces = served
    bodies = _exchange(run, "/v1/chat/completions", {
        "model": SERVE_MODEL, "messages": [{"role": "user", "content": "one two three"}],
        "max_tokens": 4, "stream": False})
    trace = _trace(traces, "chat")
    (received, body), = bodies
    assert b"chat.completion" in body
    assert trace.first_token_sent == trace.last_token_sent <= received


def test_an_embeddings_answer_is_logged_sent_no_later_than_the_client_had_it(served):
    run, traces = served
    bodies = _exchange(run, "/v1/embeddings", {"model": SERVE_MODEL,
                                               "input": ["one two three", "four five"]})
    trace = _trace(traces, "embeddings")
    (received, body), = bodies
    assert b'"embedding"' in body
    assert trace.first_token_sent == trace.last_token_sent <= received
