"""A streaming OpenAI-compatible server of known timing, in its own process (so it shares no
GIL or event loop with the client under test):

    python tests/timing_server.py --ttft-ms 20 --itl-ms 5     # prints its port, then serves

Each POST /v1/completions (prompt text, max_tokens) is answered as an SSE stream whose first
token event goes out TTFT after the request arrived and each next one ITL later, on absolute
deadlines (a late wake-up does not push the next token back), then usage and [DONE]. For each
request it notes, on time.perf_counter() (CLOCK_MONOTONIC: the same clock as the client's on
this machine), when the request arrived and when its first and last token events were written:
GET /log returns them as JSON, keyed by prompt; GET /log?clear returns them and forgets them (a
benchmark that runs client after client against one server takes each run's log so). GET
/v1/models names one model; GET /cpu the server's own CPU seconds so far.

The events are made once (no JSON per token) and written from timer callbacks of a Protocol on
uvloop, no coroutine per request: ~2,000 streamed requests/s on one core, so a 2-core machine
can hold the client to 2,000 req/s (results/loadgen_rust_parity.md gives its CPU per request).
Under uvloop's millisecond timers a token may go out up to EARLY_OK_S before its deadline; the
log has the time it was written, the truth a client's figures are held to.

Used by tests/targets/test_workers.py and tests/bench/bench_loadgen.py (and its --against);
127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.request

MODEL = "timing-model"
# uvloop rounds a timer to whole milliseconds and may fire it that much early: a token due
# within this is written now (the log holds when it was written: the truth the client is held
# to), not re-armed for a fraction of a millisecond again and again.
EARLY_OK_S = 0.001
START_TIMEOUT_S = 30.0


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _plain(body: bytes, ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        ctype,
        len(body),
        body,
    )


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
# Every token event is one of two byte strings, made once: the server spends its CPU on timing,
# not on JSON (it shares the machine with the client under test). "object" as OpenAI and vLLM
# write it: AIPerf takes a chunk without it for an error body and fails every request.
TOKEN = _event({"object": "text_completion", "choices": [{"index": 0, "text": " a", "finish_reason": None}]})
LAST_TOKEN = _event({"object": "text_completion", "choices": [{"index": 0, "text": " a", "finish_reason": "length"}]})
DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class TimingServer:
    """The log of every request, and the connections' shared timing."""

    def __init__(self, ttft_s: float, itl_s: float):
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.log: dict[str, dict] = {}
        self.usage_events: dict[int, bytes] = {}  # the usage event by token count, made once
        self.connections = 0  # accepted so far (GET /cpu): a client's connection churn
        self.loop: asyncio.AbstractEventLoop | None = None  # serve()'s running loop

    def usage_event(self, n: int) -> bytes:
        ev = self.usage_events.get(n)
        if ev is None:
            usage = {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": n + 2}
            ev = self.usage_events[n] = _event({"choices": [], "usage": usage})
        return ev


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as they arrive, each stream's token events
    written from timer callbacks on their absolute deadlines (no coroutine, no JSON per
    token: a server of known timing has to keep up with the client it measures, 2,000
    streamed requests/s on one core)."""

    def __init__(self, srv: TimingServer) -> None:
        self.srv = srv
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a stream is being written: the next request waits (HTTP/1.1)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.srv.connections += 1

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        """Answer the next complete request in the buffer, if there is one."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.transport is None:
            return
        head = self.buf[:end]
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4:end + 4 + length]
        self.buf = self.buf[end + 4 + length:]
        received = time.perf_counter()
        if head.startswith(b"GET /v1/models"):
            self.transport.write(_plain(json.dumps({"data": [{"id": MODEL}]}).encode()))
        elif head.startswith(b"GET /cpu"):  # its own CPU time: does the server keep up?
            cpu = {"cpu_s": time.process_time(), "connections": self.srv.connections}
            self.transport.write(_plain(json.dumps(cpu).encode()))
        elif head.startswith(b"GET /log"):
            self.transport.write(_plain(json.dumps(self.srv.log).encode()))
            if head.startswith(b"GET /log?clear"):
                self.srv.log = {}
        elif not head.startswith(b"POST /v1/completions"):  # /tokenize and the like
            self.transport.write(_plain(b'{"error":"not found"}').replace(b"200 OK", b"404 Not Found"))
        else:
            req = json.loads(body)
            n = int(req["max_tokens"])
            entry = self.srv.log[str(req["prompt"])] = {"received": received, "tokens": n}
            self.busy = True
            self.transport.write(HEAD)
            self._token(entry, received, 0, n)
            return
        self._next()

    def _token(self, entry: dict, received: float, i: int, n: int) -> None:
        """Token i of n, due at received + TTFT + i x ITL: written now if due, else at its time."""
        srv = self.srv
        if self.transport is None:  # the client went away
            return
        due = received + srv.ttft_s + i * srv.itl_s
        now = time.perf_counter()
        if due - now > EARLY_OK_S:
            # The loop kept from the connection: asyncio.get_running_loop() is a getpid()
            # system call on Python 3.11, once per token.
            assert srv.loop is not None
            srv.loop.call_later(due - now, self._token, entry, received, i, n)
            return
        if i == 0:
            entry["first_token"] = now
        entry["last_token"] = now
        if i + 1 < n:
            self.transport.write(TOKEN)
            self._token(entry, received, i + 1, n)
            return
        # The last token, the usage and [DONE] in one write: the server's CPU is its writes
        # (a loopback send does the receiver's TCP work too), and all three are due now.
        self.transport.write(LAST_TOKEN + srv.usage_event(n) + DONE)
        self.busy = False
        self._next()


async def serve(ttft_s: float, itl_s: float, port: int) -> None:
    srv = TimingServer(ttft_s, itl_s)
    loop = srv.loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(srv), "127.0.0.1", port, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)  # the port, for the parent
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def timing_server(ttft_ms: float, itl_ms: float):
    """Run the server in a child process; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # the port, once it listens
        if not line.strip().isdigit():
            raise RuntimeError(f"the timing server did not start (said {line!r})")
        yield f"http://127.0.0.1:{int(line)}"
    finally:
        proc.terminate()
        proc.wait(timeout=START_TIMEOUT_S)


def fetch_cpu(url: str) -> float:
    """The server process's CPU seconds so far."""
    with urllib.request.urlopen(url + "/cpu", timeout=START_TIMEOUT_S) as resp:
        return float(json.loads(resp.read())["cpu_s"])


def fetch_log(url: str, clear: bool = False) -> dict[str, dict]:
    """{prompt: {"received", "first_token", "last_token", "tokens"}} (perf_counter seconds);
    `clear`: the server forgets them once sent."""
    path = "/log?clear" if clear else "/log"
    with urllib.request.urlopen(url + path, timeout=START_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--profile", metavar="FILE", help="cProfile the server into FILE (on SIGTERM)")
    args = ap.parse_args()
    if args.profile:
        import cProfile
        import signal

        profiler = cProfile.Profile()

        def _dump(signum, frame) -> None:
            profiler.disable()
            profiler.dump_stats(args.profile)
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, _dump)
        profiler.enable()
    try:  # uvloop (a cbbench dependency): its timers and writes are C, the server keeps up
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(serve(args.ttft_ms / 1000, args.itl_ms / 1000, args.port))


if __name__ == "__main__":
    main()
