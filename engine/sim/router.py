"""Routers for data parallelism: which engine replica takes an arriving request.

- ``round-robin``: replicas in turn, blind to their load.
- ``least-requests``: the replica with the fewest unfinished requests (running + waiting), as
  vLLM's and SGLang's data-parallel front ends balance by default.
- ``least-kv``: the replica whose KV cache is least used (ties: fewest unfinished requests).

Ties go to the lowest replica index, so a run is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..core.request import Request


class ReplicaState(Protocol):
    @property
    def num_unfinished(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[ReplicaState], req: Request) -> int:
        k = self._next % len(replicas)
        self._next += 1
        return k


class LeastRequestsRouter:
    name = "least-requests"

    def choose(self, replicas: Sequence[ReplicaState], req: Request) -> int:
        return min(range(len(replicas)), key=lambda k: (replicas[k].num_unfinished, k))


class LeastKVRouter:
    name = "least-kv"

    def choose(self, replicas: Sequence[ReplicaState], req: Request) -> int:
        return min(
            range(len(replicas)),
            key=lambda k: (replicas[k].kv_usage, replicas[k].num_unfinished, k),
        )


ROUTERS = {
    r.name: r for r in (RoundRobinRouter, LeastRequestsRouter, LeastKVRouter)
}


def make_router(name: str):
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}: choose one of {', '.join(ROUTERS)}")
    return ROUTERS[name]()
