"""The server's own edges (issue 25, rule 8), against `cbbench serve --engine sim` in its own
process on 127.0.0.1.

- Beyond the connection cap, stalled connections still held a file descriptor each for the
  whole read timeout; enough of them exhausted the file limit and clients got resets, not the
  documented 503. Now a connection beyond the cap is answered 503 (within a second, or at once
  when the 503 reserve is full) and closed, the file limit keeps room for that reserve, and the
  start-up line says the cap and the limit.
- More than 64 KiB of small pipelined requests in one read got a spurious 431: head bytes are
  now counted per request, not per read.
- `--request-log` on a FIFO with no reader hung start-up silently: now one line, exit 2.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import helpers
import pytest
from helpers import serve_process

FILE_LIMIT = 600
STALLED = 800  # beyond the file limit: before the fix, accept() failed with EMFILE
CAP = 4


def _addr(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def _read_all(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    return out


@pytest.fixture
def capped_server(monkeypatch):
    """serve with a hard open-file limit of FILE_LIMIT (set in the child before it starts)."""
    monkeypatch.setattr(helpers, "CBBENCH", [
        sys.executable, "-c",
        f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({FILE_LIMIT}, "
        f"{FILE_LIMIT})); from cbbench.cli.app import main; main()",
    ])
    with serve_process("--engine", "sim", "--max-connections", str(CAP),
                       "--read-timeout", "30") as run:
        yield run


def test_connections_beyond_the_cap_get_a_503_not_a_reset(capped_server):
    run = capped_server
    ready = next(ln for ln in run.output if "ready at" in ln)
    # The start-up line says the cap's relation to the file limit.
    assert f"at most {CAP} connections" in ready and f"open-file limit {FILE_LIMIT}" in ready
    addr = _addr(run.url)
    held = [socket.create_connection(addr) for _ in range(CAP)]  # the cap, stalled
    stalled = []
    for _ in range(STALLED):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(addr)
        except BlockingIOError:
            pass
        stalled.append(s)
    time.sleep(0.2)  # not synchronization: only lets the backlog drain before the probe
    probe = socket.create_connection(addr, timeout=10)
    probe.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = _read_all(probe, 10.0)
    assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer, answer
    answered = resets = 0
    deadline = time.monotonic() + 20
    for s in stalled:
        s.setblocking(True)
        try:
            got = _read_all(s, max(0.1, deadline - time.monotonic()))
        except ConnectionResetError:
            resets += 1
            continue
        answered += got.startswith(b"HTTP/1.1 503")
    assert resets == 0 and answered == STALLED, (answered, resets)
    for s in [*held, *stalled, probe]:
        s.close()


def test_pipelined_small_requests_beyond_64_kib_are_not_431():
    n = 3000  # ~100 KiB of heads in one send: many reads of the server hold more than 64 KiB
    one = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with serve_process("--engine", "sim") as run:
        s = socket.create_connection(_addr(run.url), timeout=30)
        s.sendall(one * n)
        got = b""
        deadline = time.monotonic() + 60
        while got.count(b"HTTP/1.1 ") < n and time.monotonic() < deadline:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        s.close()
    assert b" 431 " not in got
    assert got.count(b"HTTP/1.1 200") == n


def test_a_request_log_fifo_without_a_reader_is_one_line(tmp_path):
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    proc = subprocess.run([*helpers.CBBENCH, "serve", "--engine", "sim", "--port", "0",
                           "--request-log", str(fifo)], capture_output=True, text=True,
                          timeout=60)  # hung for ever before
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a FIFO with no reader" in lines[0], proc.stderr
