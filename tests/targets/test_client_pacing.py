"""The client never sends before a request's slot, whatever event loop runs it.

uvloop (a cbbench dependency, which Ray installs in its actors when it is importable) rounds
timers to whole milliseconds and fires them up to ~1 ms early; under it a single asyncio.sleep
to a deadline returned early about half the time, so Ray workers sent requests ahead of their
schedule and reported negative send lags. (How often a plain sleep wakes early under the
installed uvloop is a measurement, not a test: python tests/bench/bench_uvloop_wakeups.py.)"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from fake_openai import FakeOpenAI, assert_accounted, endpoint_options, prompt_requests

from cbbench.targets.client_health import sleep_until
from cbbench.targets.http import run_http

uvloop = pytest.importorskip("uvloop")

SUB_MS_DELAYS_S = [0.0002 + 0.0001 * (i % 9) for i in range(90)]  # where rounding bites


def _lateness(sleep) -> list[float]:
    async def main() -> list[float]:
        out = []
        for d in SUB_MS_DELAYS_S:
            deadline = time.perf_counter() + d
            await sleep(deadline)
            out.append(time.perf_counter() - deadline)
        return out

    return uvloop.run(main())


def test_sleep_until_never_wakes_early_under_uvloop():
    assert min(_lateness(sleep_until)) >= 0


@pytest.fixture
def uvloop_policy():
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    yield
    asyncio.set_event_loop_policy(before)


def test_no_request_is_sent_before_its_slot_under_uvloop(uvloop_policy):
    n = 40
    arrivals = np.arange(n) * 0.0007  # sub-millisecond gaps: uvloop's rounding would show
    with FakeOpenAI() as server:
        run = run_http(endpoint_options(server.url), prompt_requests(["x"] * n), arrivals)
    assert_accounted(run, n)
    assert min(r.send_s - r.intended_start_s for r in run.records) >= 0
