"""One loop drives the engine for every caller (engine/core/feed.py run_feed): the in-process
run, the interrupt drain and `cbbench serve`'s engine thread.

Each test replaces run_feed, where the caller looks it up, with a spy that counts the steps it
hands on and then runs the real loop. A caller that stepped the engine with a loop of its own
would still produce tokens, but the spy would see none of its steps: the counts below must
equal the engine's own.
"""

from __future__ import annotations

import asyncio

import numpy as np
from helpers import START_TIMEOUT_S, sim_options

import cbbench.engine.core.feed as feed_module
import cbbench.server.async_engine as async_engine
from cbbench.engine.args import EngineArgs
from cbbench.engine.core.feed import ListFeed, OpenFeed
from cbbench.engine.core.request import SamplingParams
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.engine import run_engine

EVENT_TIMEOUT_S = 10.0


class Call:
    def __init__(self, feed) -> None:
        self.feed = feed
        self.steps = 0


def spy_on_run_feed(monkeypatch, module) -> list[Call]:
    """Every run_feed call made through ``module``, with the steps it delivered."""
    real = feed_module.run_feed
    calls: list[Call] = []

    def spy(engine, feed, should_stop=None, on_step=None, on_step_failed=None):
        call = Call(feed)
        calls.append(call)

        def counted(step) -> None:
            call.steps += 1
            if on_step is not None:
                on_step(step)

        return real(engine, feed, should_stop, counted, on_step_failed)

    monkeypatch.setattr(module, "run_feed", spy)
    return calls


def test_the_run_and_its_interrupt_drain_go_through_run_feed(monkeypatch):
    """A run stopped mid-way: the run's loop and then the drain are both run_feed calls, and
    the drain's (a feed with nothing pending) steps the in-flight requests to their end."""
    calls = spy_on_run_feed(monkeypatch, feed_module)
    n = 8
    wreqs = [WorkloadRequest(i, 32, 40) for i in range(n)]
    done_at_stop: list[int] = []
    progress = [0]

    def should_stop() -> bool:
        if len(calls) == 1 and calls[0].steps >= 5:  # a few steps in: everything is running
            done_at_stop.append(progress[0])
            return True
        return False

    opts = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", fast_forward=False)
    run = run_engine(opts, wreqs, np.zeros(n), should_stop=should_stop,
                     on_progress=lambda done, total: progress.__setitem__(0, done),
                     grace_s=60.0)
    assert run.interrupted
    assert len(calls) == 2
    main, drain = calls
    assert isinstance(drain.feed, ListFeed) and drain.feed.next_time() is None
    # Every iteration the engine recorded was delivered through one of the two loops.
    assert main.steps + drain.steps == len(run.iterations)
    assert main.steps == 5 and drain.steps > 0
    # What ran at the stop finished in the drain (the grace was ample), none cut off.
    assert done_at_stop == [0]
    assert sum(r.error is None for r in run.records) == n
    assert all(len(r.token_times_s) == 40 for r in run.records)


def test_the_server_steps_its_engine_through_run_feed(monkeypatch):
    """`cbbench serve`'s engine thread: one run_feed call, with the inbox as an open feed,
    delivers every step the engine took, and the request's tokens come back through it."""
    from cbbench.cli.serve import build_serving_engine

    calls = spy_on_run_feed(monkeypatch, async_engine)
    max_tokens = 6

    async def serve_one() -> tuple[list, int]:
        bridge = async_engine.AsyncEngine(lambda: build_serving_engine(sim_options()))
        bridge.start()
        try:
            assert await asyncio.to_thread(bridge.wait_ready, START_TIMEOUT_S)
            stream = bridge.submit(list(range(1, 17)), max_tokens, SamplingParams())
            events = []
            while not stream.finished:
                events.append(await asyncio.wait_for(stream.next(), EVENT_TIMEOUT_S))
            return events, bridge.snapshot().num_steps
        finally:
            await asyncio.to_thread(bridge.stop)

    events, num_steps = asyncio.run(serve_one())
    assert len(calls) == 1
    assert isinstance(calls[0].feed, OpenFeed) and calls[0].feed.next_time() is None
    tokens = [t for ev in events if isinstance(ev, async_engine.TokenEvent) for t in ev.token_ids]
    assert len(tokens) == max_tokens
    # The prefill step gives the first token: one step per token, every one seen by the spy.
    assert num_steps == max_tokens
    assert calls[0].steps == num_steps
