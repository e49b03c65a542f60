"""Does the client keep its schedule with image bodies? (issue 26; a benchmark, not a test)

    python tests/bench/bench_image_send_lag.py --rates 10,25,50,75 --duration 8 --repeats 2 \
        --nice -20 --json-out results/image_send_lag.json

For each rate, side by side in alternating order: `cbbench run --api chat` with --workload
random-mm (2 images of 1024x1024 per request, uniform-noise JPEGs as vLLM bench's random-mm:
~1.7 MB of JSON per request) and with --workload random (the same text, no images), Poisson
arrivals, against a sink server in its own process that reads each body whole without parsing
it and answers a 2-token chat stream at once: what is measured is the client (building and
sending the bodies), not a server's parse of them. Reported per run: send lag p50/p99 (the
client's own: actual send - intended), the event loop's lag, the client's CPU, the achieved
send rate, and `uptime`'s load before and after (the 2-core machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CBBENCH = [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


STREAM = (SSE_HEAD
          + _event({"id": "c", "choices": [{"index": 0, "delta": {"content": " a"}}]})
          + _event({"id": "c", "choices": [{"index": 0, "delta": {"content": " b"},
                                            "finish_reason": "length"}]})
          + _event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                             "total_tokens": 3}})
          + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
MODELS = json.dumps({"data": [{"id": "sink"}]}).encode()


async def _handle(reader, writer) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)  # read whole, never parsed
            if head.startswith(b"GET /v1/models"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
            else:
                writer.write(STREAM)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def _uptime() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _one(url: str, kind: str, rate: float, duration: float, seed: int, out: Path) -> dict:
    workload = (["--workload", "random-mm", "--images-per-request", "2", "--image-size",
                 "1024x1024"] if kind == "images" else ["--workload", "random"])
    cmd = [*CBBENCH, "run", "--endpoint", url, "--api", "chat", "--served-model", "sink",
           *workload, "--input-len", "64", "--output-len", "2", "--request-rate", str(rate),
           "--num-requests", str(int(rate * duration)), "--seed", str(seed),
           "--output", str(out), "--summary-only"]
    load0 = _uptime()
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout + proc.stderr)
    s = json.loads(out.read_text())["summary"]
    h = s["http"]
    return {
        "kind": kind, "rate": rate, "seed": seed, "wall_s": time.perf_counter() - t,
        "send_lag_p50_ms": h["send_lag_p50_ms"], "send_lag_p99_ms": h["send_lag_p99_ms"],
        "loop_lag_p50_ms": h.get("loop_lag_p50_ms"), "loop_lag_p99_ms": h.get("loop_lag_p99_ms"),
        "client_cpu_util": h.get("client_cpu_util"), "failed": s["failed"],
        "sent_rate": (s["completed"] + s["failed"]) / s["duration_s"],
        "request_bytes_mean": (s.get("request_bytes") or {}).get("mean"),
        "fell_behind": h["client_fell_behind"], "load_before": load0, "load_after": _uptime(),
        # Without the sink's port and the temporary output path (machine-specific).
        "command": " ".join(["cbbench", *cmd[3:]]).replace(url, "SINK_URL").replace(
            f" --output {out}", ""),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="10,25,50,75")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--nice", type=int, default=None,
                    help="run in a scheduler group of its own with this weight (as "
                    "bench_loadgen_ab.py; -20 needs root): the machine is shared")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        asyncio.run(_serve())
        return
    if a.nice is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_loadgen_ab import _own_cpu_share

        _own_cpu_share(a.nice)
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE,
                              text=True)
    rows = []
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        with tempfile.TemporaryDirectory() as tmp:
            for rate in (float(r) for r in a.rates.split(",")):
                for rep in range(a.repeats):
                    kinds = ("images", "text") if rep % 2 == 0 else ("text", "images")
                    for kind in kinds:
                        row = _one(url, kind, rate, a.duration, rep, Path(tmp) / "r.json")
                        rows.append(row)
                        print(json.dumps({k: v for k, v in row.items() if k != "command"}),
                              flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print("\nrate | kind | send lag p50 ms (median of repeats) | p99 | images/text p50 ratio")
    for rate in sorted({r["rate"] for r in rows}):
        med = {k: statistics.median(r["send_lag_p50_ms"] for r in rows
                                    if r["rate"] == rate and r["kind"] == k)
               for k in ("images", "text")}
        p99 = {k: statistics.median(r["send_lag_p99_ms"] for r in rows
                                    if r["rate"] == rate and r["kind"] == k)
               for k in ("images", "text")}
        print(f"{rate:g} | images {med['images']:.2f} / text {med['text']:.2f} | "
              f"{p99['images']:.1f} / {p99['text']:.1f} | {med['images'] / med['text']:.2f}")
    if a.json_out:
        a.json_out.write_text(json.dumps({"cpus": os.cpu_count(), "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
