"""How many requests per second one client process can keep on schedule here: a short
calibration of its own per-request CPU cost, before the run, so a run that one process cannot
keep says so before it starts, and `--workers auto` spreads the schedule over as many
processes as it needs (at most the cores this process may use: os.sched_getaffinity).

The cost of a streamed request is mostly per network read (one per token event: ITL apart,
each arrives on its own), so it is measured in two parts on this machine, in this process:

- the request's own Python work: its body built, its record, each of its token events parsed
  (SseStream.feed, one event a read) and its stream closed and counted;
- one network read through the client's event loop: a ping-pong of small messages between two
  connected sockets on that loop, each leg a write and a read (half a round trip counts as a
  read: the server's write is the server's CPU in a real run).

cost = own work + (output tokens + 2) reads (the head and the closing events too). It is an
estimate (the connection's set-up, the kernel's share under load and the collector are not in
it): results/loadgen_rust_parity.md holds it beside the CPU measured over whole runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from dataclasses import dataclass

from cbbench.analysis.records import RequestRecord
from cbbench.targets.client_loop import run_client
from cbbench.targets.sse import SseStream

CALIBRATION_REQUESTS = 40
CALIBRATION_PINGS = 1000
# One process holds its schedule while its event loop is busy at most this share of a core:
# past it, queueing in the loop shows in the send lag's tail (results/loadgen_capacity.md).
ONE_PROCESS_BUDGET_CORES = 0.7
_EVENT = b'data: {"id":"cmpl-0","choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n'
_LAST = b'data: {"choices":[{"index":0,"text":" a","finish_reason":"length"}]}\n\n'
_USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":%d}}\n\n'


@dataclass(frozen=True)
class ClientCost:
    request_s: float  # the request's own work, its events' parsing included
    read_s: float  # one network read through the event loop
    output_tokens: float  # the workload's mean

    @property
    def per_request_s(self) -> float:
        return self.request_s + (self.output_tokens + 2) * self.read_s

    def cores_at(self, rate: float) -> float:
        return rate * self.per_request_s

    def max_rate(self) -> float:
        """The rate one process keeps within its budget."""
        return ONE_PROCESS_BUDGET_CORES / self.per_request_s

    def workers_for(self, rate: float, cores: int) -> int:
        """Processes that keep `rate` (each within the budget), at most `cores`."""
        return max(1, min(cores, math.ceil(self.cores_at(rate) / ONE_PROCESS_BUDGET_CORES)))


def _own_work(tokens: int) -> float:
    """CPU seconds of one request's own work (see the module's docstring)."""
    payload = {"model": "m", "stream": True, "temperature": 0.0}
    usage = _USAGE % tokens
    t = time.process_time()
    for i in range(CALIBRATION_REQUESTS):
        body = json.dumps({**payload, "prompt": f"calibration {i}", "max_tokens": tokens},
                          separators=(",", ":")).encode()
        rec = RequestRecord(id=i, prompt_tokens=2, output_tokens=0, intended_start_s=0.0,
                            max_tokens=tokens)
        rec.request_bytes = len(body)
        st = SseStream(False, rec.token_times_s)
        for k in range(tokens - 1):
            st.feed(_EVENT, 0.001 * k)
        st.feed(_LAST, 0.001 * tokens)
        st.feed(usage, 0.001 * tokens)
        st.feed(b"data: [DONE]\n\n", 0.001 * tokens)
        st.close(0.001 * tokens)
        rec.output_tokens = len(st.times)
    return (time.process_time() - t) / CALIBRATION_REQUESTS


class _Ping(asyncio.Protocol):
    def __init__(self, left: list[int], done: asyncio.Future) -> None:
        self.left, self.done = left, done
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.left[0] -= 1
        if self.left[0] <= 0:
            if not self.done.done():
                self.done.set_result(None)
            return
        assert self.transport is not None
        self.transport.write(b"x")


async def _read_cost() -> float:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    left = [2 * CALIBRATION_PINGS]
    done = loop.create_future()
    ta, pa = await loop.connect_accepted_socket(lambda: _Ping(left, done), a)
    tb, _ = await loop.connect_accepted_socket(lambda: _Ping(left, done), b)
    t = time.process_time()
    ta.write(b"x")
    await done
    spent = time.process_time() - t
    ta.close()
    tb.close()
    return spent / (2 * CALIBRATION_PINGS)  # a write and a read a leg: counted as one read


def calibrate(output_tokens: float) -> ClientCost:
    """This process's client cost per request (about 0.1 s to measure)."""
    own = _own_work(max(1, round(output_tokens)))
    return ClientCost(own, run_client(_read_cost()), output_tokens)


def schedule_rate(arrivals) -> float:
    """The schedule's mean rate (requests/s over its span), 0 for a burst or one request: a
    burst (--request-rate inf) has no rate to keep, so it is not calibrated and `--workers
    auto` sends it from one process (an infinite rate made ClientCost.workers_for raise)."""
    n = len(arrivals)
    if n < 2:
        return 0.0
    span = float(max(arrivals)) - float(min(arrivals))
    return (n - 1) / span if span > 0 else 0.0
