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
/v1/models names one model.

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
# not on JSON (it shares the machine with the client under test).
TOKEN = _event({"choices": [{"index": 0, "text": " a", "finish_reason": None}]})
LAST_TOKEN = _event({"choices": [{"index": 0, "text": " a", "finish_reason": "length"}]})
DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class TimingServer:
    def __init__(self, ttft_s: float, itl_s: float):
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.log: dict[str, dict] = {}

    async def _stream(self, req: dict, received: float, writer) -> None:
        n = int(req["max_tokens"])
        entry = self.log[str(req["prompt"])] = {"received": received, "tokens": n}
        writer.write(HEAD)
        for i in range(n):
            delay = received + self.ttft_s + i * self.itl_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t = time.perf_counter()
            writer.write(LAST_TOKEN if i == n - 1 else TOKEN)
            if i == 0:
                entry["first_token"] = t
            entry["last_token"] = t
            await writer.drain()
        usage = {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": n + 2}
        writer.write(_event({"choices": [], "usage": usage}))
        writer.write(DONE)
        await writer.drain()

    async def handle(self, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length) if length else b""
                received = time.perf_counter()
                if head.startswith(b"GET /v1/models"):
                    writer.write(_plain(json.dumps({"data": [{"id": MODEL}]}).encode()))
                elif head.startswith(b"GET /log"):
                    writer.write(_plain(json.dumps(self.log).encode()))
                    if head.startswith(b"GET /log?clear"):
                        self.log = {}
                else:
                    await self._stream(json.loads(body), received, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def serve(ttft_s: float, itl_s: float, port: int) -> None:
    srv = TimingServer(ttft_s, itl_s)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", port, backlog=4096)
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
    args = ap.parse_args()
    asyncio.run(serve(args.ttft_ms / 1000, args.itl_ms / 1000, args.port))


if __name__ == "__main__":
    main()
