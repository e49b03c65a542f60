"""Load-generator capacity: can the client keep an open-loop schedule at RATE requests/s?

    python tests/bench/bench_loadgen.py [--rate 500] [--duration 10] [--arrival constant|poisson]
                                  [--workers N]
    python tests/bench/bench_loadgen.py --workers 2 --rates 400,800,1200 --duration 5   # a sweep
    python tests/bench/bench_loadgen.py --against 6a0ec45 --rate 500 --requests 7500    # side by side

`--against REV`: this tree's client and commit REV's, interleaved, against a server of known
timing (TTFT 150 ms, ITL 20 ms; Poisson arrivals unless --arrival says otherwise), held to the
server's own log: tests/bench/bench_loadgen_ab.py. Without it:

Starts a minimal streaming server in a separate process (`--serve`: raw asyncio HTTP/1.1 on
127.0.0.1, 4 short SSE token events + usage + [DONE] per request, no delay), so the server
does not share the client's GIL, then replays RATE x DURATION requests through
cbbench.targets.http.run_http and reports the achieved request rate, the send lag (actual
send - intended start) and the client's CPU time per request. Not collected by pytest (the name
does not start with test_). Results: results/loadgen_capacity.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time

import bench_loadgen_ab  # tests/bench/, beside this file
import numpy as np

TOKENS_PER_REQUEST = 4
MODEL = "loadgen-bench"
SERVER_START_TIMEOUT_S = 10.0


# ---- the server (its own process) ----------------------------------------------------------
def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _stream_body() -> bytes:
    """The whole streamed response, built once: every request gets the same bytes."""
    out = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    ]
    for i in range(TOKENS_PER_REQUEST):
        finish = "length" if i == TOKENS_PER_REQUEST - 1 else None
        ev = {"choices": [{"index": 0, "text": " a", "finish_reason": finish}]}
        out.append(_chunk(b"data: " + json.dumps(ev).encode() + b"\n\n"))
    usage = {"prompt_tokens": 2, "completion_tokens": TOKENS_PER_REQUEST, "total_tokens": 6}
    out.append(_chunk(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"))
    out.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return b"".join(out)


STREAM = _stream_body()
_models = json.dumps({"data": [{"id": MODEL}]}).encode()
MODELS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(_models),
    _models,
)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            writer.write(MODELS if head.startswith(b"GET /v1/models") else STREAM)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)  # the port, for the parent
    async with server:
        await server.serve_forever()


# ---- the client (this process) -------------------------------------------------------------
def _start_server() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    line = proc.stdout.readline()  # blocks until the server prints its port
    if not line.strip().isdigit() or time.monotonic() > deadline:
        proc.kill()
        raise SystemExit(f"the bench server did not start (said {line!r})")
    return proc, int(line)


def bench(
    rate: float,
    duration: float,
    arrival: str,
    seed: int,
    max_concurrency: int | None,
    workers: int = 1,
    port: int | None = None,
) -> dict:
    import aiohttp  # run_http imports its transport lazily: keep that out of the measured CPU

    from cbbench.distributed.plan import LoadPlan
    from cbbench.distributed.run import run_load
    from cbbench.load.arrivals import arrival_times
    from cbbench.load.workload import WorkloadRequest
    from cbbench.targets.http import EndpointOptions

    n = int(rate * duration)
    wreqs = [WorkloadRequest(i, 2, TOKENS_PER_REQUEST, prompt="hello there") for i in range(n)]
    process = "constant" if arrival == "constant" else "gamma"  # gamma shape 1 = Poisson
    arrivals = arrival_times(wreqs, rate, 1.0, process, seed)
    proc = None
    if port is None:
        proc, port = _start_server()
    try:
        opts = EndpointOptions(
            f"http://127.0.0.1:{port}", served_model=MODEL, max_concurrency=max_concurrency
        )
        load_before = os.getloadavg()[0]
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        run = run_load(
            opts, wreqs, arrivals, LoadPlan(workers)
        )
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    recs = run.records
    ok = [r for r in recs if r.ok]
    sends = np.array([r.send_s for r in recs])
    lag_ms = np.array([(r.send_s - r.intended_start_s) * 1e3 for r in recs])
    ttft_ms = np.array([r.ttft_s * 1e3 for r in ok])
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if workers > 1:  # the workers' own CPU (each measured its process) + this parent's
        cpu_s += run.info["client_cpu_s"]
    return {
        "requests": n,
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "error_types": sorted({r.error_type for r in recs if r.error_type}),
        "target_rate": rate,
        "arrival": arrival,
        "duration_s": run.duration_s,
        "achieved_send_rate": (len(recs) - 1) / (sends.max() - sends.min()) if len(recs) > 1 else 0,
        "achieved_completion_rate": len(ok) / run.duration_s,
        "send_lag_ms": {f"p{p}": float(np.percentile(lag_ms, p)) for p in (50, 90, 99, 100)},
        "ttft_ms": {f"p{p}": float(np.percentile(ttft_ms, p)) for p in (50, 99)},
        "client_cpu_s": cpu_s,  # this process, everything in run_http included
        "client_cpu_us_per_request": cpu_s / max(1, len(recs)) * 1e6,
        "client_cpu_util": cpu_s / run.duration_s,
        "max_in_flight": run.info["max_in_flight"],
        "client_fell_behind": run.info["client_fell_behind"],
        "workers": workers,
        "worker_send_lag_p50_ms": [w["send_lag_p50_ms"] for w in run.info["workers"]],
        "loop_lag_ms": {"p50": run.info["loop_lag_p50_ms"], "p99": run.info["loop_lag_p99_ms"]},
        "client_bound": run.info["client_bound"],
        "loadavg_1min_before": load_before,  # other work on the machine shares its CPUs
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}",
        "aiohttp": aiohttp.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", action="store_true", help="run the bench server (internal)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--arrival", choices=("constant", "poisson"),
                    help="default: constant; poisson with --against")
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="client processes (cbbench --workers)")
    ap.add_argument("--rates", help="a sweep: comma-separated rates, one run each, one server")
    bench_loadgen_ab.add_arguments(ap)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(_serve(args.port))
        return
    if args.against:
        args.arrival = args.arrival or "poisson"
        bench_loadgen_ab.compare(args)
        return
    args.arrival = args.arrival or "constant"
    if args.rates is None:
        out = bench(
            args.rate, args.duration, args.arrival, args.seed, args.max_concurrency, args.workers
        )
        print(json.dumps(out, indent=2))
        return
    proc, port = _start_server()
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            out = bench(
                rate, args.duration, args.arrival, args.seed, args.max_concurrency,
                args.workers, port,
            )
            print(json.dumps(out), flush=True)  # one line per rate
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
