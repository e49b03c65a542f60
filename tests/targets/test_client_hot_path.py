"""The client's per-request cost, kept where the first round had it (issue 30): what a run does
for every network read of every request, and the garbage collector's reach during a run.

results/loadgen_capacity.md measures it side by side (tests/bench/bench_loadgen.py --against
REV); these tests pin the two causes that measurement found, without timing anything:
- no coroutine is resumed per read of a stream (issue 41: the events are parsed in the connection's
  data_received; before it, every coroutine between the task and the socket was):
  a single request's chain is task -> _exchange -> send_request -> exchange (three of cbbench's
  coroutines, as 6a0ec45 had: _one -> _within -> _exchange; it had grown to six);
- a run freezes the heap made before it (gc.freeze), so no collection during the run walks the
  modules and the workload, and thaws it at the end; a caller's own freeze is left alone;
- a network read's buffer (asyncio's recv of 256 KiB) comes from the heap, not from a fresh mmap
  (mmap + mremap + munmap and page faults on every read: +25-30% of the client's CPU per
  request, present or not by the accident of what the process freed before; read_buffers.py).
  Seen as minor page faults: a mapped buffer faults on every read, a heap one does not.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import endpoint_options, prompt_requests

from cbbench.load.cancel import CancelPlan
from cbbench.load.delays import parse_delay
from cbbench.targets import read_buffers, sse
from cbbench.targets.http import run_http


def _cbbench_chain() -> list[str]:
    """The names of cbbench's coroutines on the stack of the running task, outermost first
    (each is resumed when the task is)."""
    names = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_flags & inspect.CO_COROUTINE and "cbbench" in code.co_filename:
            names.append(code.co_name)
        frame = frame.f_back
    return names[::-1]


def _chains_seen_by_feed(monkeypatch) -> list[list[str]]:
    chains: list[list[str]] = []
    feed = sse.SseStream.feed

    def spy(self, piece, t):
        chains.append(_cbbench_chain())
        return feed(self, piece, t)

    monkeypatch.setattr(sse.SseStream, "feed", spy)
    return chains


def test_each_stream_read_resumes_no_coroutine(fresh_fake_server, monkeypatch):
    """Issue 41: a read's events are parsed in the connection's data_received
    (targets/stream_pool.py), so no coroutine of cbbench is resumed per read (the first
    round resumed three: _exchange -> send_request -> exchange, through aiohttp's reader)."""
    chains = _chains_seen_by_feed(monkeypatch)
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests([f"hello {i}" for i in range(5)]), [0.0] * 5)
    assert all(r.error is None for r in run.records)
    assert chains, "the stream was never read"
    assert {tuple(c) for c in chains} == {()}


def test_a_cancellable_request_reads_its_stream_as_the_others_do(fresh_fake_server, monkeypatch):
    """--cancel-rate's wrapper (a task of its own, cut at the cancel time) waits on the
    requests it picked; their reads, like every request's, resume no coroutine."""
    chains = _chains_seen_by_feed(monkeypatch)
    plan = CancelPlan(0.5, parse_delay("10000", "--cancel-after"), seed=0)
    n = 12
    picked = sum(plan.cancel_after_s(i) is not None for i in range(n))
    assert 0 < picked < n  # the premise: some picked, some not
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests([f"hi {i}" for i in range(n)]), [0.0] * n,
                   cancel=plan)
    assert all(r.error is None and not r.cancelled for r in run.records)  # 10 s: none cut
    assert {tuple(c) for c in chains} == {()}


def test_the_run_freezes_the_heap_from_before_it_and_thaws_it(fresh_fake_server):
    assert gc.get_freeze_count() == 0
    seen: list[int] = []
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests([f"x {i}" for i in range(4)]), [0.0] * 4,
                   on_progress=lambda done, total: seen.append(gc.get_freeze_count()))
    assert all(r.error is None for r in run.records)
    assert seen and min(seen) > 0  # frozen for the whole run
    assert gc.get_freeze_count() == 0  # and thawed after it


def test_a_callers_frozen_heap_is_left_alone(fresh_fake_server):
    gc.freeze()
    try:
        seen: list[int] = []
        run_http(endpoint_options(fresh_fake_server.url), prompt_requests(["y"]), [0.0],
                 on_progress=lambda done, total: seen.append(gc.get_freeze_count()))
        assert seen and min(seen) > 0
        # Not unfrozen by the run (the count only falls as frozen objects are freed).
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_side_by_side_bench_holds_the_client_to_the_server_log():
    """bench_loadgen_ab.figures: TTFT error = the client's TTFT (from the intended start) minus
    the server's (received -> first token written), per request; send lag and rate from sends."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_loadgen_ab import figures

    recs = [  # run-clock seconds; the server's clock differs by any offset (differences only)
        {"id": 0, "intended": 0.0, "send": 0.001, "first": 0.153, "ok": True, "error_type": None},
        {"id": 1, "intended": 0.01, "send": 0.014, "first": 0.170, "ok": True, "error_type": None},
        {"id": 2, "intended": 0.02, "send": 0.021, "first": None, "ok": False,
         "error_type": "timeout"},
    ]
    log = {"t-0": {"received": 100.0015, "first_token": 100.1515},
           "t-1": {"received": 100.0145, "first_token": 100.1645}}
    out = {"records": recs, "cpu_s": 0.3, "wall_s": 1.0, "window": None,
           "loop_lag_p99_ms": None, "client_fell_behind": False,
           "gc": {"collections": 0, "pause_total_ms": 0.0, "pause_max_ms": 0.0}}
    fig = figures(out, log, "t", 3)
    # request 0: client 153 ms, server 150 ms -> 3 ms; request 1: 160 - 150 -> 10 ms
    assert fig["ttft_err_p50_ms"] == pytest.approx(6.5)
    assert fig["ttft_err_p99_ms"] == pytest.approx(3 + 0.99 * 7)
    assert fig["send_lag_p50_ms"] == pytest.approx(1.0)  # lags 1, 4, 1 ms
    assert fig["achieved_send_rate"] == pytest.approx(2 / 0.020)
    assert (fig["completed"], fig["failed"], fig["error_types"]) == (2, 1, ["timeout"])
    assert fig["client_cpu_cores"] == pytest.approx(0.3)


# glibc's thresholds at process start (128 KiB), set explicitly: the process whose history never
# raised them, where every 256 KiB read buffer is mmapped. (Explicit values also stop glibc's
# own raising, so what follows depends on nothing the process did before.)
_GLIBC_START = (
    "import ctypes; libc = ctypes.CDLL('libc.so.6'); "
    f"libc.mallopt({read_buffers.M_TRIM_THRESHOLD}, 128 * 1024); "
    f"libc.mallopt({read_buffers.M_MMAP_THRESHOLD}, 128 * 1024)\n"
)
READS = 200
glibc_only = pytest.mark.skipif(read_buffers._libc_mallopt() is None, reason="glibc's malloc only")


def _faults_per_read(fix: bool) -> float:
    """Minor page faults per socket read of asyncio's size, in a fresh process."""
    import asyncio.selector_events

    size = asyncio.selector_events._SelectorTransport.max_size
    code = _GLIBC_START + (
        "from cbbench.targets.read_buffers import keep_reads_on_heap\n"
        "assert keep_reads_on_heap() is True\n" if fix else ""
    ) + (
        "import resource, socket\n"
        "a, b = socket.socketpair(); kept = []\n"
        "f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        f"for _ in range({READS}):\n"
        "    a.send(b'data: {}' * 40); kept.append(b.recv(" + str(size) + "))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) / READS


@glibc_only
def test_a_read_buffer_comes_from_the_heap_not_a_fresh_mapping():
    # The premise, so the test can fail: at glibc's start values each read faults in a new page.
    assert _faults_per_read(fix=False) >= 1
    assert _faults_per_read(fix=True) < 0.2
    import asyncio.selector_events

    assert asyncio.selector_events._SelectorTransport.max_size < read_buffers.MMAP_THRESHOLD_BYTES


_RUN_READS = _GLIBC_START + """
import json, resource, socket, sys
sys.path.insert(0, {tests!r})
from fake_openai import endpoint_options, prompt_requests
import cbbench.targets.http as http
from cbbench.targets.http import run_http
if not {fix}:  # the premise: the same run without the fix
    http.keep_reads_on_heap = lambda: False
reads = faults = 0
recv = socket.socket.recv
def counted(self, n, *a):  # the transport's read: its count and the page faults inside it
    global reads, faults
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    try:
        return recv(self, n, *a)
    finally:
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f
        reads += 1
socket.socket.recv = counted
n = {n}
# A token every 2 ms: each is a network read of its own, unless the loop was busy.
run = run_http(endpoint_options({url!r}),
               prompt_requests([f"delay:0.002 r {{i}}" for i in range(n)], output_len={tokens}),
               [i * 0.002 for i in range(n)])
assert all(r.error is None for r in run.records), [r.error for r in run.records]
print(json.dumps({{"reads": reads, "faults": faults, "requests": n}}))
"""
TOKENS = 8


@glibc_only
def test_a_run_reads_its_streams_without_a_page_fault_per_read(fresh_fake_server):
    """A whole run, in a process at glibc's start values: its socket reads fault in no page
    (the fix), where without it each read faults in one or two; and a request takes no more
    reads than its stream has writes (one per token event, the head, the usage and [DONE])."""

    def run(fix: bool) -> dict:
        code = _RUN_READS.format(tests=str(Path(__file__).resolve().parents[1]), n=200,
                                 url=fresh_fake_server.url, fix=fix, tokens=TOKENS)
        # asyncio's own loop: its selector transport is what reads into 256 KiB buffers (uvloop,
        # the client's loop where installed, reads only what arrived: client_loop.py).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
               "CBBENCH_CLIENT_LOOP": "asyncio"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    without, fixed = run(fix=False), run(fix=True)
    assert without["faults"] / without["reads"] >= 0.9, f"the premise: {without}"
    assert fixed["faults"] / fixed["reads"] < 0.1, fixed
    assert fixed["reads"] / fixed["requests"] <= TOKENS + 3, fixed


def test_a_finished_requests_parser_is_not_kept_to_the_runs_end(fresh_fake_server):
    """The parser's lists (kinds, running counts, tool calls) outlive their request only while
    it is in flight: kept to the run's end they were ~4 more objects per request for the
    collector, and 7,500 requests at 500 req/s brought a full collection back into the run
    (a 40-70 ms stall of the event loop) despite the frozen heap."""
    n = 20
    live: list[int] = []

    def progress(done: int, total: int) -> None:
        if done == total:  # the last request has just ended
            live.append(sum(type(o) is sse.SseStream for o in gc.get_objects()))

    run = run_http(endpoint_options(fresh_fake_server.url),
                   prompt_requests([f"k {i}" for i in range(n)]), [0.0] * n, on_progress=progress)
    assert all(r.error is None for r in run.records)
    assert run.records[0].event_tokens  # what the stream said is on the record
    # The last one's parser is still referenced by its ending coroutine; no other is.
    assert live and live[0] <= 1, f"{live[0]} of {n} parsers alive at the run's end"
