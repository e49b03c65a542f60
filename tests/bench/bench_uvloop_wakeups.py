"""How often one asyncio.sleep to a deadline wakes before it under uvloop, against the client's
sleep_until (tests/targets/test_client_pacing.py checks that sleep_until never does).

    python tests/bench/bench_uvloop_wakeups.py [--rounds 10]

uvloop rounds timers to whole milliseconds; at sub-millisecond delays a plain sleep returned
early about half the time (the reason sleep_until loops). A uvloop that stops rounding would
show 0 early wake-ups here, and sleep_until's loop would then be a no-op, not a fix.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import uvloop

from cbbench.targets.client_health import sleep_until

SUB_MS_DELAYS_S = [0.0002 + 0.0001 * (i % 9) for i in range(90)]  # where rounding bites


def lateness(sleep) -> list[float]:
    async def main() -> list[float]:
        out = []
        for d in SUB_MS_DELAYS_S:
            deadline = time.perf_counter() + d
            await sleep(deadline)
            out.append(time.perf_counter() - deadline)
        return out

    return uvloop.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    plain = lambda deadline: asyncio.sleep(deadline - time.perf_counter())  # noqa: E731
    for name, sleep in (("asyncio.sleep", plain), ("sleep_until", sleep_until)):
        late = [x for _ in range(args.rounds) for x in lateness(sleep)]
        early = [x for x in late if x < 0]
        worst = min(late) * 1e3
        print(f"{name:14s} {len(early)}/{len(late)} woke early (earliest {worst:+.3f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
