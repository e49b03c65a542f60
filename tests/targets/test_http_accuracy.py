"""How accurately `cbbench run --endpoint` measures: each request's client-side TTFT and TPOT
against the server's own timestamps for the same request.

`cbbench serve --engine sim` runs in-process (uvicorn in a thread on a free 127.0.0.1 port, as
in test_serve.py; llama-3.2-1b on a simulated H200 with 2 ms per-iteration overhead: ~2.7 ms
iterations served in real time) and the CLI replays 200 requests at 50 requests/s against it.

The server is observed, not changed: a pure-ASGI middleware notes when the HTTP request reached
the app and when its first token chunk went to the transport; the bridge's `submit` is wrapped
to note when the request handler got the request, and each request's event stream is wrapped to
read its `Admitted` time (the engine's arrival time, what `return_token_times` reports) and
token times. Every prompt is a token-id list whose first id is a marker (MARKER_BASE + its
workload line), so client and server records are matched exactly, not by timing or order.

Client and server share the host's perf_counter clock, but only differences are compared:
client TTFT - send lag = first token read - send (client clock) against three server TTFTs,
from the outside in:
- wire: the request reached the ASGI app -> the first token chunk was handed to the transport.
  What is left is the client's own measurement error: loopback, uvicorn's parsing, and both
  event loops' wake-ups.
- handler: the request handler received it -> the engine made the first token (the issue's
  definition). Adds the server-internal wait for the iteration in progress and the engine
  thread -> event loop hand-over, which the client rightly counts and the engine cannot see.
- engine: the engine's arrival -> first token (`return_token_times`), reported only: it also
  leaves out the wait for the engine's next iteration boundary (~half an iteration).
The client's figure can only be the larger one (causality): the errors are >= 0.

Tolerances, for a shared 2-core machine: outputs are short (8-24 tokens) because the test's own
CPU (one SSE event per token, handled on both ends in one process) is what stretches the path
once other jobs saturate the host (64-token outputs took the wire p50 from ~1.5 to ~12 ms at a
load average of 6); the server is warmed up first (its first streamed response imports anyio's
backend inside the event loop); a run that still misses a bound is measured again, up to
ATTEMPTS runs in all, and every run's figures (with the load average and how late a 1 ms sleep
in this process woke) are in the failure message. The bounds never move.
Every network loop here is bounded in count and time.
"""

from __future__ import annotations

import contextvars
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
import uvicorn
from helpers import START_TIMEOUT_S, Running, invoke_app, sim_options

from cbbench.cli.serve import build_serving_engine
from cbbench.schema import read_run, to_dict
from cbbench.server.app import create_app
from cbbench.server.engine_events import Admitted, TokenEvent

NUM_REQUESTS = 200
REQUEST_RATE = 50
MARKER_BASE = 50_000  # a prompt's first token id: MARKER_BASE + its workload line
PROMPT_LEN = (16, 257)
OUTPUT_LEN = (8, 25)  # varied, so a wrong match would show as a token-count mismatch
KV_BLOCKS = 4096  # ample: no preemption in the comparison
TTFT_P50_BOUND_MS = 5.0  # the bound on p50 |client - server|
TPOT_P50_BOUND_MS = 0.5  # a TPOT difference is spread over the whole decode: tighter
ATTEMPTS = 3
PROBE_SLEEP_S = 0.001
PROBE_MAX_SAMPLES = 100_000
POLL_S = 0.02
MS = 1000.0


# ---- observing the server ------------------------------------------------------------------
@dataclass
class WireTimes:
    received: float  # the HTTP request reached the ASGI app
    first_chunk: float | None = None  # the first body chunk (a token event) went to the transport


_WIRE: contextvars.ContextVar[WireTimes] = contextvars.ContextVar("wire_times")


class WireTimesMiddleware:
    """Pure ASGI: notes the request's arrival at the app and its first body chunk's send; the
    request's handler (same task) finds them in a context variable."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            return await self.app(scope, receive, send)
        times = WireTimes(time.perf_counter())
        _WIRE.set(times)

        async def timed_send(message):
            body = message["type"] == "http.response.body" and message.get("body")
            if times.first_chunk is None and body:
                times.first_chunk = time.perf_counter()  # before: a read may beat the return
            await send(message)

        await self.app(scope, receive, timed_send)


@dataclass
class ServerSide:
    """One request as the server saw it (perf_counter seconds)."""

    wire: WireTimes
    received: float  # the request handler submitted it to the engine
    admitted: float | None = None  # the engine took it in (return_token_times' arrival_time)
    token_times: list[float] = field(default_factory=list)  # when the engine made each token
    handed_over: list[float] = field(default_factory=list)  # when the handler got each token


class ServerRecorder:
    """Wraps the bridge's `submit`; keys each request by its prompt's marker token."""

    def __init__(self, submit) -> None:
        self.submit = submit
        self.seen: dict[int, ServerSide] = {}

    def __call__(self, prompt_ids, max_tokens, sampling, **kwargs):
        received = time.perf_counter()
        stream = self.submit(prompt_ids, max_tokens, sampling, **kwargs)  # images' encoder_flops...
        rec = self.seen[prompt_ids[0]] = ServerSide(_WIRE.get(), received)
        read = stream.next

        async def next_event():
            ev = await read()
            if isinstance(ev, Admitted):
                rec.admitted = ev.time_s
            elif isinstance(ev, TokenEvent):
                rec.token_times.append(ev.time_s)
                rec.handed_over.append(time.perf_counter())
            return ev

        stream.next = next_event
        return stream


@pytest.fixture(scope="module")
def srv():
    """test_serve's in-process server, with the wire-times middleware in the app."""
    app = create_app(lambda: build_serving_engine(sim_options(num_kv_blocks=KV_BLOCKS)))
    app.add_middleware(WireTimesMiddleware)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    run = Running(f"http://127.0.0.1:{port}", app, server, thread)
    try:
        assert run.engine.wait_ready(START_TIMEOUT_S), run.engine.error
        # Warm up: the first streamed response imports anyio's asyncio backend inside the
        # server's event loop (~0.1 s here), which would stall the first measured requests.
        req = {"prompt": [1, 2, 3], "max_tokens": 2, "stream": True}
        with (
            httpx.Client(base_url=run.url, timeout=30.0) as c,
            c.stream("POST", "/v1/completions", json=req) as r,
        ):
            assert r.status_code == 200
            assert sum(1 for _ in r.iter_lines()) < 100
        yield run
    finally:
        run.stop()


class WakeProbe:
    """A thread that sleeps PROBE_SLEEP_S at a time and notes how late it wakes: how much CPU
    (and GIL) this process gets, independent of the code under test."""

    def __init__(self) -> None:
        self.late_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.late_ms) < PROBE_MAX_SAMPLES:
            t = time.perf_counter()
            time.sleep(PROBE_SLEEP_S)
            self.late_ms.append((time.perf_counter() - t - PROBE_SLEEP_S) * MS)

    def __enter__(self) -> WakeProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(START_TIMEOUT_S)

    def percentiles_ms(self) -> tuple[float, float]:
        if not self.late_ms:
            return math.nan, math.nan
        p50, p90 = np.percentile(self.late_ms, [50, 90])
        return float(p50), float(p90)


# ---- one measurement -----------------------------------------------------------------------
def _percentiles(values) -> dict[str, float]:
    a = np.abs(np.asarray(values, dtype=np.float64))
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(a.max())}


def _fmt(p: dict[str, float]) -> str:
    return "p50 {p50:.3f} p90 {p90:.3f} p99 {p99:.3f} max {max:.3f} ms".format(**p)


def _workload(path, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    workload = []
    for i in range(NUM_REQUESTS):
        n = int(rng.integers(*PROMPT_LEN))
        ids = [MARKER_BASE + i] + rng.integers(100, 30_000, n - 1).tolist()
        workload.append({"prompt_token_ids": ids, "output_len": int(rng.integers(*OUTPUT_LEN))})
    path.write_text("".join(json.dumps(w) + "\n" for w in workload))
    return workload


def _measure(srv, tmp_path, attempt: int) -> tuple[dict, str]:
    """One 200-request run; hard checks inside; returns the error percentiles and a report."""
    path = tmp_path / f"marked-{attempt}.jsonl"
    workload = _workload(path, seed=attempt)
    out = tmp_path / f"run-{attempt}.json"
    recorder = ServerRecorder(srv.engine.submit)
    srv.engine.submit = recorder
    try:
        with WakeProbe() as probe:
            res = invoke_app(
                [
                    "run", "--endpoint", srv.url, "--workload", str(path),
                    "--num-requests", str(NUM_REQUESTS), "--request-rate", str(REQUEST_RATE),
                    "--output", str(out), "--save-detailed",
                ],
            )
    finally:
        del srv.engine.submit  # back to the bridge's own method
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    assert result["summary"]["completed"] == NUM_REQUESTS and result["summary"]["failed"] == 0

    # Match every client record to its server record by the marker.
    rows = result["requests"]
    assert sorted(r["id"] for r in rows) == list(range(NUM_REQUESTS))
    assert len(recorder.seen) == NUM_REQUESTS
    err = {"wire": [], "handler": [], "engine": [], "tpot": []}
    admission_wait, hand_over, server_tpot = [], [], []
    for r in rows:
        s = recorder.seen[MARKER_BASE + r["id"]]
        w = workload[r["id"]]
        n = w["output_len"]
        assert r["output_tokens"] == len(r["token_times_s"]) == len(s.token_times) == n
        assert r["server_prompt_tokens"] == r["prompt_tokens"] == len(w["prompt_token_ids"])
        assert s.admitted is not None and s.wire.first_chunk is not None
        assert s.wire.received <= s.received <= s.admitted <= s.token_times[0]
        assert s.token_times[0] <= s.handed_over[0] <= s.wire.first_chunk

        client_ttft = r["ttft_ms"] - r["send_lag_ms"]  # first token read - send
        err["wire"].append(client_ttft - (s.wire.first_chunk - s.wire.received) * MS)
        err["handler"].append(client_ttft - (s.token_times[0] - s.received) * MS)
        err["engine"].append(client_ttft - (s.token_times[0] - s.admitted) * MS)
        s_tpot = (s.token_times[-1] - s.token_times[0]) / (n - 1) * MS
        err["tpot"].append(r["tpot_ms"] - s_tpot)
        server_tpot.append(s_tpot)
        admission_wait.append((s.admitted - s.received) * MS)
        hand_over.append((s.handed_over[0] - s.token_times[0]) * MS)

    # Causality: the client sends before the server receives and reads after the server made
    # and sent the token, so its TTFT is never the smaller one (a clock slip would be).
    for view in ("wire", "handler", "engine"):
        assert min(err[view]) >= 0, (view, min(err[view]))
    # The served timing is what the test means to serve: ~2-3 ms iterations.
    assert 1.5 < float(np.median(server_tpot)) < 5.0, np.median(server_tpot)

    stats = {k: _percentiles(v) for k, v in err.items()}
    http = result["summary"]["http"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    wake = probe.percentiles_ms()
    report = (
        f"run {attempt + 1} (1-min load average {load:.2f} on {os.cpu_count()} CPUs; a 1 ms "
        f"sleep in this process woke late by p50 {wake[0]:.3f} p90 {wake[1]:.3f} ms), "
        f"|client TTFT - send lag - server TTFT| with the server TTFT from: the wire "
        f"{_fmt(stats['wire'])}; the handler's receipt to the engine's first token "
        f"{_fmt(stats['handler'])}; the engine's arrival (return_token_times) "
        f"{_fmt(stats['engine'])}. |TPOT error| {_fmt(stats['tpot'])}. Inside the server "
        f"(p50): handler receipt -> engine arrival {np.median(admission_wait):.3f} ms, engine "
        f"-> event loop {np.median(hand_over):.3f} ms; client send lag p50 "
        f"{http['send_lag_p50_ms']:.3f} ms, p99 {http['send_lag_p99_ms']:.3f} ms; server TPOT "
        f"p50 {np.median(server_tpot):.3f} ms"
    )
    return stats, report


def _within_bounds(stats: dict) -> bool:
    return (
        stats["wire"]["p50"] < TTFT_P50_BOUND_MS
        and stats["handler"]["p50"] < TTFT_P50_BOUND_MS
        and stats["tpot"]["p50"] < TPOT_P50_BOUND_MS
    )


def test_client_ttft_and_tpot_agree_with_the_server(srv, tmp_path, record_property):
    reports = []
    for attempt in range(ATTEMPTS):
        stats, report = _measure(srv, tmp_path, attempt)
        print(report)
        reports.append(report)
        if _within_bounds(stats):
            break
    record_property("http_accuracy", "\n".join(reports))
    assert _within_bounds(stats), (
        f"no run of {ATTEMPTS} met p50 |TTFT error| < {TTFT_P50_BOUND_MS} ms (wire and handler) "
        f"and p50 |TPOT error| < {TPOT_P50_BOUND_MS} ms:\n" + "\n".join(reports)
    )
