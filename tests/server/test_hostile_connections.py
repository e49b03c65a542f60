"""Slow and greedy HTTP clients against `cbbench serve` (issue 19): a client that sends half a
request and stalls is cut off after --read-timeout (stated default DEFAULT_READ_TIMEOUT_S), a
request head may hold MAX_HEAD_BYTES, and connections beyond --max-connections get a clear 503.
Before, 1,000 half-sent requests were all still held after 30 s, and with a lower file limit a
few hundred made /health time out.

The server is `cbbench serve --engine sim` in its own process, with a 1.5 s read timeout and a
cap of 16 connections so each case takes seconds.
"""

from __future__ import annotations

import json
import socket
import time
from contextlib import ExitStack
from urllib.parse import urlsplit

import httpx
import pytest
from helpers import SERVE_MODEL, invoke_app, serve_process, wait_until

READ_TIMEOUT_S = 1.5
MAX_CONNECTIONS = 16
HALF_REQUEST = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


@pytest.fixture(scope="module")
def server():
    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200",
                       "--read-timeout", str(READ_TIMEOUT_S),
                       "--max-connections", str(MAX_CONNECTIONS)) as run:
        yield run


def _connect(url: str) -> socket.socket:
    u = urlsplit(url)
    return socket.create_connection((u.hostname, u.port), timeout=10)


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within ``seconds``, what it sent)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while data := sock.recv(65536):
            got += data
        return True, got
    except TimeoutError:
        return False, got
    except OSError:  # reset
        return True, got


def _health(url: str) -> int:
    return httpx.get(url + "/health", timeout=10).status_code


def test_half_sent_requests_are_cut_off_after_the_read_timeout(server):
    with ExitStack() as stack:
        stalled = [stack.enter_context(_connect(server.url)) for _ in range(8)]
        for i, s in enumerate(stalled):
            if i % 2:
                s.sendall(HALF_REQUEST)  # half the head
            else:  # the whole head, half the body
                s.sendall(HALF_REQUEST + b"content-length: 100\r\n\r\n" + b'{"prompt": "')
        t0 = time.monotonic()
        for s in stalled:
            closed, got = _closed_within(s, READ_TIMEOUT_S + 5)
            assert closed, "a stalled connection was still held"
            assert got == b"" or got.startswith(b"HTTP/1.1 408"), got[:100]
        assert time.monotonic() - t0 < READ_TIMEOUT_S + 5
    assert _health(server.url) == 200


def test_a_request_head_beyond_the_limit_is_431(server):
    with _connect(server.url) as s:
        s.sendall(HALF_REQUEST)
        try:
            for _ in range(64):  # 4 MiB of one header, never ended
                s.sendall(b"x-junk: " + b"a" * 65536)
        except OSError:
            pass  # the server hung up: what it sent is still readable
        closed, got = _closed_within(s, READ_TIMEOUT_S + 5)
    assert closed and got.startswith(b"HTTP/1.1 431"), got[:200]
    assert _health(server.url) == 200


def test_connections_beyond_the_cap_get_a_clear_503(server):
    with ExitStack() as stack:
        held = [stack.enter_context(_connect(server.url)) for _ in range(MAX_CONNECTIONS)]
        for s in held:
            s.sendall(HALF_REQUEST)
        # The server has taken them all once /health (one connection more) is refused.
        wait_until(lambda: _health(server.url) == 503, 10, "the connection cap to be reached")
        r = httpx.get(server.url + "/health", timeout=10)
        assert r.status_code == 503
        err = r.json()["error"]
        assert "--max-connections" in err["message"] and err["code"] == "too_many_connections"
        for s in held:  # the read timeout frees the slots
            assert _closed_within(s, READ_TIMEOUT_S + 5)[0]
    deadline = time.monotonic() + 5
    while _health(server.url) != 200:
        assert time.monotonic() < deadline, "slots were not freed"
        time.sleep(0.1)


def test_a_normal_streamed_request_outlives_the_read_timeout(server):
    """The read timeout covers reading a request, not the answer: a stream that runs longer
    than it completes."""
    body = {"prompt": "hi", "max_tokens": 1500, "stream": True}
    n = 0
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                n += 1
    assert n == 1500
    assert json.dumps(body)  # the body was well-formed


def test_the_defaults_are_stated_in_the_help():
    from cbbench.server.limits import DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S

    out = invoke_app(["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "--read-timeout" in out and "--max-connections" in out
    assert f"{DEFAULT_READ_TIMEOUT_S:g}" in out and str(DEFAULT_MAX_CONNECTIONS) in out


def test_stopping_with_open_streams_ends_them_without_tracebacks():
    """Ctrl-C with streams open printed one ASGI traceback per stream (uvicorn cancelled them
    after its graceful-shutdown wait). Now the streams end at once with an error event and
    [DONE], and the server stops without a traceback."""
    import signal
    import threading

    got: list[str] = []
    flowing = threading.Semaphore(0)  # one release per stream, at its first bytes

    def stream(url: str) -> None:
        body = {"prompt": "hi", "max_tokens": 100_000, "stream": True}
        parts: list[str] = []
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for part in r.iter_text():
                    if not parts:
                        flowing.release()
                    parts.append(part)
            got.append("".join(parts))
        except httpx.HTTPError as e:
            got.append(f"error: {e!r}")

    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200") as run:
        clients = [threading.Thread(target=stream, args=(run.url,)) for _ in range(3)]
        for t in clients:
            t.start()
        for _ in clients:  # every stream is flowing
            assert flowing.acquire(timeout=60), "a stream never started"
        t0 = time.monotonic()
        run.proc.send_signal(signal.SIGINT)
        run.proc.wait(30)
        stopped_in = time.monotonic() - t0
        for t in clients:
            t.join(30)
        assert run.output_done.wait(10), "the server's output did not end"
        text = run.text
    assert "Traceback" not in text, text[-3000:]
    assert stopped_in < 4, f"took {stopped_in:.1f} s to stop"
    assert len(got) == 3
    for body in got:
        assert "shutting down" in body and body.rstrip().endswith("data: [DONE]"), body[-300:]


def test_a_request_log_that_cannot_be_written_stops_logging_not_serving(caplog):
    """Found in this round: a request log on a full disk killed its writer thread with a
    traceback, and every later request's trace queued up in memory for ever. Now one warning,
    the log stops, and the server serves on. /dev/full fails every write with ENOSPC."""
    from pathlib import Path

    from helpers import sim_options, start_server

    from cbbench.cli.serve import build_serving_engine
    from cbbench.server.app import ServeConfig

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    run = start_server(lambda: build_serving_engine(sim_options()),
                       ServeConfig(request_log="/dev/full"))
    try:
        with httpx.Client(base_url=run.url, timeout=20) as c:
            for _ in range(30):
                r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                assert r.status_code == 200
            log = run.app.state.request_log
            wait_until(lambda: log._queue.qsize() == 0, 10, "traces pile up in memory")
            assert c.get("/health").status_code == 200
    finally:
        run.stop()
    warnings = [r for r in caplog.records if "request log" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()


@pytest.mark.parametrize("host", ["127.0.0.1", "no such host.invalid"])
def test_a_server_that_cannot_listen_says_why_in_one_line(host):
    """uvicorn logged its bind error as a second stderr line (`ERROR: [Errno 98] ...`)."""
    import subprocess

    from helpers import CBBENCH

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*CBBENCH, "serve", "--engine", "sim", "--model", SERVE_MODEL,
                               "--host", host, "--port", str(port), "--api-key", "k"],
                              capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"cbbench: error: could not listen on {host}")
    assert "Errno" in lines[0], lines
