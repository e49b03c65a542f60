"""What a new connection costs: CPU seconds per loopback connection opened through the streams'
pool (stream_pool.StreamPool._connect on uvloop), and per connection the timing server accepts.

    python tests/bench/bench_connect_cost.py [--connections 500]

Two ways: one after another, and all at once (as the first wave of an open-loop run opens
them). The server's CPU is read from /proc/PID/stat. This is the evidence for not opening the
pool before the clock starts (results/loadgen_cpu_per_request.md): a run opens about rate x
latency connections, once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from bench_cpu_per_request import ITL_MS, TTFT_MS, _proc_cpu, _start_server  # noqa: E402


async def _open(url: str, n: int) -> tuple[float, float]:
    from yarl import URL

    from cbbench.targets.stream_pool import StreamPool

    costs = []
    for together in (False, True):
        pool = StreamPool(URL(url + "/v1/completions"), {}, None)
        t = time.process_time()
        if together:
            await asyncio.gather(*(pool._connect() for _ in range(n)))
        else:
            for _ in range(n):
                await pool._connect()
        costs.append((time.process_time() - t) / n * 1e6)
        pool.close()
        await asyncio.sleep(0.2)  # the closes reach the server
    return costs[0], costs[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=500)
    args = ap.parse_args()
    import uvloop

    proc, url = _start_server(ROOT / "tests" / "timing_server.py", None)
    try:
        u0, s0 = _proc_cpu(proc.pid)
        seq, together = uvloop.run(_open(url, args.connections))
        u1, s1 = _proc_cpu(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    server = (u1 - u0 + s1 - s0) / (2 * args.connections) * 1e6
    print(f"client CPU per connection: {seq:.0f} us one after another, {together:.0f} us "
          f"{args.connections} at once; the server's per accepted connection: {server:.0f} us "
          f"(TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms server, idle)")


if __name__ == "__main__":
    main()
