"""Feeding the engine: what arrives when, including arrivals that depend on the engine.

A fixed list of requests arrives at fixed times (``ListFeed``). Some load does not: a chat
session's next turn arrives a think time after the previous reply finished, and a client that
gives up aborts its request some time after sending it. A ``RequestFeed`` hands the engine what
is due and hears about every finished request, so its next events can depend on them;
``run_feed`` is the one loop that drives the engine from any feed, on the engine's clock: the
in-process run, the interrupt drain (a feed with nothing pending) and ``cbbench serve`` (an
``OpenFeed`` whose events are its clients' requests) all step the engine through it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .engine import StepFailed
from .request import Request

if TYPE_CHECKING:
    from .engine import Engine, StepOutput


class RequestSink(Protocol):
    """What a feed hands its events to: one engine, or replicas behind a router."""

    def add_request(self, req: Request) -> str | None: ...

    def abort_request(self, req: Request) -> None: ...


class RequestFeed(Protocol):
    def next_time(self) -> float | None:
        """The time of the earliest pending event (an arrival, an abort); None when nothing is
        pending (events may still come from requests that are yet to finish)."""
        ...

    def fire(self, engine: RequestSink, now: float) -> None:
        """Hand the engine every event due at ``now`` (add_request, abort_request)."""
        ...

    def on_step(self, step: StepOutput) -> None:
        """Called after every iteration: the finished requests may schedule new events."""
        ...


@runtime_checkable
class OpenFeed(RequestFeed, Protocol):
    """A feed whose events come from outside the run (a server's clients): it is never done,
    so ``run_feed`` ends only by ``should_stop``. With nothing to step and nothing pending, the
    loop calls ``idle()``, which returns once an event may have come (or a while passed)."""

    def idle(self) -> None: ...


class EngineStalled(RuntimeError):
    """Requests are waiting but none can be scheduled, and no event is coming to change that."""


class ListFeed:
    """Requests sorted by arrival_time, each added once its time has come."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = requests
        self.i = 0

    def next_time(self) -> float | None:
        return self.requests[self.i].arrival_time if self.i < len(self.requests) else None

    def fire(self, engine: RequestSink, now: float) -> None:
        reqs, i, n = self.requests, self.i, len(self.requests)
        while i < n and reqs[i].arrival_time <= now:
            engine.add_request(reqs[i])
            i += 1
        self.i = i

    def on_step(self, step: StepOutput) -> None:
        return None


def run_feed(
    engine: Engine,
    feed: RequestFeed,
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[StepOutput], None] | None = None,
    on_step_failed: Callable[[StepFailed], None] | None = None,
) -> bool:
    """Step the engine until the feed has nothing pending and every request is done, sleeping
    (or, on a virtual clock, jumping) to the next event when idle; an ``OpenFeed`` waits in its
    ``idle()`` instead of ending. Returns False when ``should_stop`` ended the run early. A step
    that raised failed its own requests (``on_step_failed``); the run goes on with the rest.
    Before each step the clock hears whether it follows the last one back to back
    (``begin_step``: a pacing clock, cbbench/server/paced_clock.py, uses it)."""
    clock = engine.clock
    idle = feed.idle if isinstance(feed, OpenFeed) else None
    back_to_back = False

    def emit(step: StepOutput) -> None:  # every step, stepped or fast-forwarded
        feed.on_step(step)
        if on_step is not None:
            on_step(step)

    while True:
        if should_stop is not None and should_stop():
            return False
        feed.fire(engine, clock.now())
        if engine.decode_cost_model is not None:
            # A stretch of decode-only steps up to the feed's next event, in one move.
            t = feed.next_time()
            if engine.fast_forward(math.inf if t is None else t, emit):
                continue
        step = None
        if engine.has_unfinished():
            clock.begin_step(back_to_back)
            try:
                step = engine.step()
            except StepFailed as e:
                back_to_back = False
                if on_step_failed is not None:
                    on_step_failed(e)
                continue
        back_to_back = step is not None
        if step is not None:
            emit(step)
        elif not _wait_for_event(engine, feed, idle):
            return True


def _wait_for_event(engine: Engine, feed: RequestFeed, idle: Callable[[], None] | None) -> bool:
    """Nothing was stepped: sleep to the feed's next event, or wait in an open feed's idle.
    False: nothing is pending and every request is done (the run is over)."""
    t = feed.next_time()
    if t is not None:
        engine.clock.sleep_until(t)
    elif idle is not None:
        idle()
    elif engine.has_unfinished():
        raise EngineStalled("engine stalled: requests are waiting but none can be scheduled")
    else:
        return False
    return True


def run_until_done(
    engine: Engine,
    requests: Sequence[Request],
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[StepOutput], None] | None = None,
) -> bool:
    """Feed ``requests`` (sorted by arrival_time) to the engine at their arrival times and step
    until all are done. Returns False when ``should_stop`` ended the run early. (Load whose
    arrivals depend on the engine: run_feed with its own feed.)"""
    return run_feed(engine, ListFeed(requests), should_stop, on_step)
