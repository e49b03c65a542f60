"""Disaggregated prefill and decode (DistServe, Splitwise, llm-d): P prefill instances and D
decode instances, each a whole simulated engine (its own continuous-batching queue, KV pool
and virtual clock; with tensor parallelism, its own group of GPUs).

A request's life:

1. It arrives and the router picks a prefill instance, where it queues and prefills like any
   request, told to stop after one token: its first token is emitted there (TTFT is the
   prefill instance's).
2. Its KV (the prompt's tokens, all layers) leaves over the named link (engine/sim/kv_link.py):
   latency + bytes / (bandwidth x the instance's GPUs holding distinct KV: under expert
   parallelism a request's KV is on one GPU). Each prefill instance's link carries one
   transfer at a time (one per GPU under expert parallelism), in the order they were ready,
   so a busy link queues them; the
   time from the end of the prefill to the KV's arrival is the request's ``kv_transfer_ms``.
3. On arrival the router picks a decode instance. The request joins its queue holding its
   computed tokens (as a swapped-out request does, with no CPU copy to make); once admitted
   it gets blocks for its KV and decodes from its second token on. Preempted there, it
   recomputes on the decode instance (its KV is not sent again).

Assumptions, stated: the decode instance allocates the KV's blocks when it admits the
request, not before the transfer (vLLM's NIXL connector allocates first and pulls); the
prefill instance keeps the request's blocks until its KV has arrived (the link reads them,
as NIXL's prefill side frees them on the decode side's notice); transfers
do not slow the instances' own iterations; a request whose whole output is one token never
leaves its prefill instance.

One discrete-event loop, as for data parallelism (engine/sim/replicas.py): the next event is an
arrival, a KV arrival, or the step of the busy instance furthest behind in time. Iteration
records say which pool and which instance of it ran them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from ..core.engine import Engine, StepOutput
from ..core.iteration import IterationRecord
from ..core.request import Request, RequestStatus
from .kv_link import KVLink
from .replicas import Replica, ReplicaClock
from .router import DEFAULT_MAX_IMBALANCE, make_router

PREFILL, DECODE = "prefill", "decode"


class PoolReplica(Replica):
    def __init__(self, index: int, engine: Engine, pool: str) -> None:
        super().__init__(index, engine)
        self.pool = pool


class DisaggregatedSet:
    def __init__(
        self,
        prefill: Sequence[Engine],
        decode: Sequence[Engine],
        link: KVLink,
        kv_bytes_per_token: float,
        gpus_per_instance: int,
        router: str,
        max_imbalance: int = DEFAULT_MAX_IMBALANCE,
        kv_links: int | None = None,
        kv_lanes: int = 1,
    ) -> None:
        if not prefill or not decode:
            raise ValueError("disaggregation needs at least one prefill and one decode instance")
        self.prefill = [PoolReplica(k, e, PREFILL) for k, e in enumerate(prefill)]
        self.decode = [PoolReplica(k, e, DECODE) for k, e in enumerate(decode)]
        self.replicas = self.prefill + self.decode  # stepping order breaks time ties
        self.prefill_router = make_router(router, max_imbalance)
        self.decode_router = make_router(router, max_imbalance)
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.gpus_per_instance = gpus_per_instance
        # The links a request's KV crosses at once: one a GPU holding a distinct share of it
        # (fewer than the GPUs when tensor parallelism replicates KV heads; None: every GPU).
        self.kv_links = kv_links or gpus_per_instance
        self.clock = ReplicaClock(self.replicas)
        # When each prefill instance's transfer lanes are next idle: one lane per group of
        # GPUs holding whole requests (expert parallelism: each GPU its own requests' KV, sent
        # over its own link, beside the others).
        self._link_free = [[0.0] * kv_lanes for _ in self.prefill]
        self._transfers: list[tuple[float, int, Request]] = []  # (arrival, seq, request)
        self._seq = 0
        self._max_tokens: dict[int, int] = {}  # request id -> its real max_tokens
        self._where: dict[int, PoolReplica | None] = {}  # None: in transit
        # In transit: the prefill instance still holding its blocks, and those blocks.
        self._held: dict[int, tuple[Engine, list[int], int]] = {}
        self.kv_transfer_ms: list[float] = []

    # ---- what the front asks of a set of engines ------------------------------------------
    @property
    def engines(self) -> list[Engine]:
        return [r.engine for r in self.replicas]

    @property
    def executor(self):
        return self.prefill[0].engine.executor

    @property
    def num_gpus(self) -> int:
        return len(self.replicas) * self.gpus_per_instance

    @property
    def rejected(self) -> list[Request]:
        return [req for e in self.engines for req in e.rejected]

    @property
    def records(self) -> list[IterationRecord]:
        merged = [rec for e in self.engines for rec in e.records]
        order = {PREFILL: 0, DECODE: 1}
        return sorted(merged, key=lambda rec: (rec.start_s, order[rec.pool or PREFILL], rec.replica))

    def has_unfinished(self) -> bool:
        return bool(self._transfers) or any(e.has_unfinished() for e in self.engines)

    def next_busy_time(self) -> float:
        times = [r.engine.clock.now() for r in self.replicas if r.engine.has_unfinished()]
        if self._transfers:
            times.append(self._transfers[0][0])
        return min(times, default=math.inf)

    # ---- requests --------------------------------------------------------------------------
    def add_request(self, req: Request) -> str | None:
        """Route an arrived request to a prefill instance. One that could never run on a
        decode instance (its whole output does not fit) is rejected now, not after its
        first token."""
        decode0 = self.decode[0].engine
        if decode0.scheduler.rejection_reason(req) is not None:
            decode0.clock.advance_to(req.arrival_time)
            return decode0.add_request(req)  # records the rejection
        k = self.prefill_router.choose(self.prefill, req)
        replica = self.prefill[k]
        replica.engine.clock.advance_to(req.arrival_time)
        self._max_tokens[req.request_id] = req.max_tokens
        if req.max_tokens > 1:  # its KV will leave: the instance keeps it until then
            replica.engine.kv_to_send.add(req.request_id)
        req.max_tokens = 1  # the prefill instance stops after the first token
        self._where[req.request_id] = replica
        reason = replica.engine.add_request(req)
        if reason is not None:
            req.max_tokens = self._max_tokens.pop(req.request_id)
            replica.engine.kv_to_send.discard(req.request_id)
        return reason

    def abort_request(self, req: Request) -> None:
        rid = req.request_id
        if rid not in self._where:
            return
        replica = self._where[rid]
        if rid in self._max_tokens:
            req.max_tokens = self._max_tokens.pop(rid)
        if replica is not None:
            replica.engine.kv_to_send.discard(rid)
            replica.engine.abort_request(req)
            return
        # In transit: drop the transfer; the request ends where the clock of the set is.
        self._transfers = [t for t in self._transfers if t[2] is not req]
        heapq.heapify(self._transfers)
        self._release(req)
        req.status = RequestStatus.ABORTED
        req.finish_reason = "abort"
        req.finish_time = self.clock.now()

    # ---- the loop's step -------------------------------------------------------------------
    def step_next(self) -> StepOutput | None:
        """Deliver every KV transfer due before the next step, then step the busy instance
        furthest behind; None when nothing is busy and nothing is in transit."""
        while True:
            busy = [r for r in self.replicas if r.engine.has_unfinished()]
            t_busy = min((r.engine.clock.now() for r in busy), default=math.inf)
            if self._transfers and self._transfers[0][0] <= t_busy:
                t, _, req = heapq.heappop(self._transfers)
                self._deliver(req, t)
                continue
            if not busy:
                return None
            replica = min(busy, key=lambda r: (r.engine.clock.now(), r.pool != PREFILL,
                                               r.index))
            step = replica.engine.step()
            if step is None:
                raise RuntimeError(f"{replica.pool} instance {replica.index} stalled: requests "
                                   "are waiting but none can be scheduled")
            step.record.replica = replica.index
            step.record.pool = replica.pool
            if replica.pool == DECODE or not step.finished:
                return step
            done = [req for req in step.finished if not self._send(req, replica)]
            return StepOutput(step.record, step.scheduled, done)

    def _send(self, req: Request, replica: PoolReplica) -> bool:
        """A request that finished its prefill: queue its KV on the instance's link. False
        when it is done already (one output token)."""
        rid = req.request_id
        real = self._max_tokens.pop(rid)
        req.max_tokens = real
        if req.num_output_tokens >= real:
            del self._where[rid]
            return False
        ready = req.finish_time
        assert ready is not None  # it finished its prefill this step
        engine = replica.engine
        engine.kv_to_send.discard(rid)
        self._held[rid] = (engine, req.block_table, req.num_registered_blocks)
        req.block_table, req.num_registered_blocks = [], 0
        lanes = self._link_free[replica.index]
        lane = min(range(len(lanes)), key=lanes.__getitem__)
        start = max(ready, lanes[lane])
        nbytes = req.num_prompt_tokens * self.kv_bytes_per_token
        arrive = start + self.link.transfer_s(nbytes, self.kv_links)
        lanes[lane] = arrive
        self.kv_transfer_ms.append((arrive - ready) * 1e3)
        heapq.heappush(self._transfers, (arrive, self._seq, req))
        self._seq += 1
        self._where[rid] = None
        req.status = RequestStatus.RUNNING  # not done: in transit
        req.finish_time = None
        req.finish_reason = None
        return True

    def _release(self, req: Request) -> None:
        """Free the blocks the prefill instance held for ``req``'s KV, now it has left."""
        engine, table, registered = self._held.pop(req.request_id)
        req.block_table, req.num_registered_blocks = table, registered
        engine.block_manager.free(req)

    def _deliver(self, req: Request, t: float) -> None:
        self._release(req)
        k = self.decode_router.choose(self.decode, req)
        replica = self.decode[k]
        engine = replica.engine
        engine.clock.advance_to(t)
        self._where[req.request_id] = replica
        # Admission gives it blocks for its computed tokens and a decode.
        engine.scheduler.add_request(req, kv_elsewhere=True)
