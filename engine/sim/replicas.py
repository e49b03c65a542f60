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
from .router import DEFAULT_MAX_IMBALANCE, make_router


class Replica:
    def __init__(self, index: int, engine: Engine) -> None:
        self.index = index
        self.engine = engine
        # Read for every replica on every step of the loop: held here, not looked up.
        self.scheduler = engine.scheduler
        self.clock = engine.clock

    @property
    def busy(self) -> bool:
        s = self.scheduler
        return bool(s.running) or bool(s.waiting)

    @property
    def num_unfinished(self) -> int:
        return self.engine.scheduler.num_unfinished

    @property
    def kv_usage(self) -> float:
        bm = self.engine.block_manager
        return bm.num_used_blocks / bm.num_blocks if bm.num_blocks else 0.0

    def prefix_hit_blocks(self, req: Request) -> int:
        """Leading blocks of ``req`` this replica's prefix cache holds now (0 without prefix
        caching, or for a request whose token ids are unknown)."""
        bm = self.engine.block_manager
        if not bm.enable_prefix_caching or req.prompt_token_ids is None:
            return 0
        return len(bm.lookup_prefix(req))


class ReplicaClock:
    """The run's clock as the front sees it: the furthest replica's time (virtual)."""

    realtime = False

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self._replicas = replicas

    def now(self) -> float:
        return max(r.engine.clock.now() for r in self._replicas)


class ReplicaSet:
    def __init__(self, engines: Sequence[Engine], router: str,
                 max_imbalance: int = DEFAULT_MAX_IMBALANCE) -> None:
        if not engines:
            raise ValueError("data parallelism needs at least one replica")
        if any(e.clock.realtime for e in engines):
            raise ValueError("engine replicas run on virtual clocks (the simulator)")
        self.replicas = [Replica(k, e) for k, e in enumerate(engines)]
        self.router = make_router(router, max_imbalance)
        self.clock = ReplicaClock(self.replicas)
        self.assignments: dict[int, int] = {}  # request id -> replica
        # The busy replica furthest behind (what the loop asks three times per step), kept
        # until a request or a step changes the replicas' queues or clocks.
        self._next: Replica | None = None
        self._next_known = False

    def _next_replica(self) -> Replica | None:
        """The busy replica furthest behind in time (ties: the lowest index); None when none
        is busy."""
        if self._next_known:
            return self._next
        best, best_t = None, math.inf
        for r in self.replicas:
            s = r.scheduler
            if s.running or s.waiting:
                t = r.clock.now()
                if t < best_t:
                    best, best_t = r, t
        self._next, self._next_known = best, True
        return best

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
        self._next_known = False
        engine = self.replicas[k].engine
        engine.clock.advance_to(req.arrival_time)
        self.assignments[req.request_id] = k
        return engine.add_request(req)

    def abort_request(self, req: Request) -> None:
        k = self.assignments.get(req.request_id)
        if k is not None:
            self._next_known = False
            self.replicas[k].engine.abort_request(req)

    def step_next(self) -> StepOutput | None:
        """Step the busy replica furthest behind in time; None when none is busy."""
        replica = self._next_replica()
        if replica is None:
            return None
        self._next_known = False
        step = replica.engine.step()
        if step is None:
            raise RuntimeError(
                f"engine replica {replica.index} stalled: requests are waiting but none can "
                "be scheduled"
            )
        step.record.replica = replica.index
        return step

    def next_busy_time(self) -> float:
        replica = self._next_replica()
        return replica.clock.now() if replica is not None else math.inf

    def fast_forward_next(self, horizon: float, feed: RequestFeed, on_step) -> bool:
        """Fast-forward the replica step_next would step, up to ``horizon`` (the feed's next
        event: replicas meet only through the router, at arrivals). False: step normally."""
        replica = self._next_replica()
        if replica is None:
            return False
        engine = replica.engine
        if engine.decode_cost_model is None:
            return False
        self._next_known = False  # it may move the replica's clock

        def emit(step: StepOutput) -> None:
            step.record.replica = replica.index
            feed.on_step(step)
            if on_step is not None:
                on_step(step)

        return engine.fast_forward(horizon, emit) > 0


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
        ff = getattr(replicas, "fast_forward_next", None)
        if ff is not None and ff(math.inf if t is None else t, feed, on_step):
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
