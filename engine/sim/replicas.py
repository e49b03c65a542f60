"""Data parallelism in the simulator: N independent engine replicas behind a router.

Each replica is a whole simulated engine (its own scheduler, KV pool and virtual clock; with
tensor parallelism, its own group of GPUs). One discrete-event loop drives them: the next
event is either an arrival (routed, then queued on its replica) or the step of the replica
whose clock is furthest behind, so every replica's iterations happen in time order and the
router sees each replica as it is at the arrival (a replica in the middle of an iteration is
seen as that iteration leaves it). Iteration records carry their replica.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..core.engine import Engine, StepFailed, StepOutput
from ..core.feed import RequestFeed
from ..core.iteration import IterationRecord
from ..core.request import Request
from .router import make_router


class Replica:
    def __init__(self, index: int, engine: Engine) -> None:
        self.index = index
        self.engine = engine

    @property
    def num_unfinished(self) -> int:
        return self.engine.scheduler.num_unfinished

    @property
    def kv_usage(self) -> float:
        bm = self.engine.block_manager
        return bm.num_used_blocks / bm.num_blocks if bm.num_blocks else 0.0


class ReplicaClock:
    """The run's clock as the front sees it: the furthest replica's time (virtual)."""

    realtime = False

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self._replicas = replicas

    def now(self) -> float:
        return max(r.engine.clock.now() for r in self._replicas)


class ReplicaSet:
    def __init__(self, engines: Sequence[Engine], router: str) -> None:
        if not engines:
            raise ValueError("data parallelism needs at least one replica")
        if any(e.clock.realtime for e in engines):
            raise ValueError("engine replicas run on virtual clocks (the simulator)")
        self.replicas = [Replica(k, e) for k, e in enumerate(engines)]
        self.router = make_router(router)
        self.clock = ReplicaClock(self.replicas)
        self.assignments: dict[int, int] = {}  # request id -> replica

    @property
    def engines(self) -> list[Engine]:
        return [r.engine for r in self.replicas]

    @property
    def executor(self):
        """One replica's executor (they are alike), for what the front asks of it."""
        return self.replicas[0].engine.executor

    @property
    def rejected(self) -> list[Request]:
        return [req for e in self.engines for req in e.rejected]

    @property
    def records(self) -> list[IterationRecord]:
        """Every replica's records, in start-time order (ties: replica order)."""
        merged = [rec for e in self.engines for rec in e.records]
        return sorted(merged, key=lambda rec: (rec.start_s, rec.replica))

    def has_unfinished(self) -> bool:
        return any(e.has_unfinished() for e in self.engines)

    def add_request(self, req: Request) -> str | None:
        """Queue an arrived request on the router's replica (an idle replica's clock first
        moves up to the arrival). Returns the rejection reason, as Engine.add_request."""
        k = self.router.choose(self.replicas, req)
        engine = self.replicas[k].engine
        engine.clock.advance_to(req.arrival_time)
        self.assignments[req.request_id] = k
        return engine.add_request(req)

    def abort_request(self, req: Request) -> None:
        k = self.assignments.get(req.request_id)
        if k is not None:
            self.replicas[k].engine.abort_request(req)

    def step_next(self) -> StepOutput | None:
        """Step the busy replica furthest behind in time; None when none is busy."""
        busy = [r for r in self.replicas if r.engine.has_unfinished()]
        if not busy:
            return None
        replica = min(busy, key=lambda r: (r.engine.clock.now(), r.index))
        step = replica.engine.step()
        if step is None:
            raise RuntimeError(
                f"engine replica {replica.index} stalled: requests are waiting but none can "
                "be scheduled"
            )
        step.record.replica = replica.index
        return step

    def next_busy_time(self) -> float:
        times = [r.engine.clock.now() for r in self.replicas if r.engine.has_unfinished()]
        return min(times, default=math.inf)


def run_replicas(
    replicas: ReplicaSet,
    feed: RequestFeed,
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[StepOutput], None] | None = None,
    on_step_failed: Callable[[StepFailed], None] | None = None,
) -> bool:
    """``feed.run_feed`` for a replica set: the feed's events (arrivals, aborts) go through
    the router, the replicas step in time order, until nothing is pending or running.
    Returns False when ``should_stop`` ended the run early; a step that raised failed its
    own requests (``on_step_failed``) and the run goes on."""
    while True:
        if should_stop is not None and should_stop():
            return False
        t = feed.next_time()
        # An event no later than every busy replica's clock fires first, so the router sees
        # no replica that is still behind it in time.
        if t is not None and t <= replicas.next_busy_time():
            feed.fire(replicas, t)
            continue
        try:
            step = replicas.step_next()
        except StepFailed as e:
            if on_step_failed is not None:
                on_step_failed(e)
            continue
        if step is None:  # nothing running, nothing pending
            return True
        feed.on_step(step)
        if on_step is not None:
            on_step(step)
