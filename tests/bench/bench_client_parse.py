"""The client's per-request parse path, without the network: CPU per request of a 16-token
completions stream as tests/timing_server.py writes it (the head, 15 token events, then the
last token with the usage and [DONE]: 17 network reads), fed read by read to
stream_pool.StreamConnection.data_received (httptools) and the request's SseStream.

    python tests/bench/bench_client_parse.py [--against REV] [--requests 3000] [--rounds 5]

`--against REV`: REV's cbbench/targets/sse.py and stream_pool.py loaded beside this tree's
(as modules of their own), the two alternated round by round in this one process, so both
see the same machine; the minimum over the rounds of each. CPU seconds (time.process_time).
Results: results/loadgen_cpu_per_request.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from timing_server import DONE, HEAD, LAST_TOKEN, TOKEN, TimingServer  # noqa: E402

TOKENS = 16


def _module(rev: str, rel: str, name: str, tmp: Path) -> ModuleType:
    src = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    path = tmp / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class _Pool:
    def release(self, conn) -> None:
        pass

    def forget(self, conn) -> None:
        pass


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def per_request_us(sse: ModuleType, pool_mod: ModuleType, n: int) -> float:
    loop = asyncio.new_event_loop()
    conn = pool_mod.StreamConnection(_Pool())
    conn.transport = _Transport()
    reads = [HEAD] + [TOKEN] * (TOKENS - 1) + [LAST_TOKEN + TimingServer(0, 0).usage_event(TOKENS)
                                               + DONE]
    t = time.process_time()
    for _ in range(n):
        times: list[float] = []
        ex = pool_mod._Exchange(sse.SseStream(False, times), 0.0, loop.create_future())
        conn.ex = ex
        for r in reads:
            conn.data_received(r)
        if len(times) != TOKENS or not ex.done.done():
            raise SystemExit(f"parsed {len(times)} token events of {TOKENS}")
    loop.close()
    return (time.process_time() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from cbbench.targets import sse, stream_pool

    sides = {"worktree": (sse, stream_pool)}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            sides = {args.against: (
                _module(args.against, "cbbench/targets/sse.py", "sse_ref", Path(tmp)),
                _module(args.against, "cbbench/targets/stream_pool.py", "pool_ref", Path(tmp)),
            ), **sides}
        got: dict[str, list[float]] = {name: [] for name in sides}
        for mods in sides.values():
            per_request_us(*mods, 300)  # warm
        for k in range(args.rounds):
            for name, mods in (sides.items() if k % 2 == 0 else reversed(sides.items())):
                got[name].append(per_request_us(*mods, args.requests))
    print(f"parse path, CPU per 16-token request (us), min of {args.rounds} rounds:")
    for name, us in got.items():
        print(f"  {name}: {min(us):.1f}  (rounds: {', '.join(f'{u:.1f}' for u in us)})")
    if args.against:
        a, b = min(got[args.against]), min(got["worktree"])
        print(f"  worktree / {args.against}: {b / a:.2f}")


if __name__ == "__main__":
    main()
