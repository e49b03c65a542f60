"""Routers for data parallelism: which engine replica takes an arriving request.

- ``round-robin``: replicas in turn, blind to their load.
- ``least-requests``: the replica with the fewest unfinished requests (running + waiting, one
  weight). vLLM's internal data-parallel balancer weighs a waiting request four times a running
  one (``waiting * 4 + running``, v1/engine/core_client.py); SGLang's DP controller defaults to
  round-robin.
- ``least-kv``: the replica whose KV cache is least used (ties: fewest unfinished requests).
- ``prefix-aware``: the replica whose prefix cache holds the most of the request's leading
  blocks (the engine's own lookup: the same chained block hashes its admission will use),
  among the replicas within a load-imbalance limit of the least loaded one (at most
  ``max_imbalance`` more unfinished requests), so a popular prefix cannot pile every request
  onto one replica (SGLang's cache-aware router and llm-d's prefix scorer bound it alike).
  No hit anywhere: the least-loaded replica. Ties: fewer unfinished requests, then index.

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

    def prefix_hit_blocks(self, req: Request) -> int: ...


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


# Unfinished requests a replica may have above the least-loaded one and still win on its cache.
DEFAULT_MAX_IMBALANCE = 16


class PrefixAwareRouter:
    name = "prefix-aware"

    def __init__(self, max_imbalance: int = DEFAULT_MAX_IMBALANCE) -> None:
        self.max_imbalance = max_imbalance

    def choose(self, replicas: Sequence[ReplicaState], req: Request) -> int:
        loads = [r.num_unfinished for r in replicas]
        bound = min(loads) + self.max_imbalance
        best, best_key = 0, None
        for k, r in enumerate(replicas):
            if loads[k] > bound:
                continue
            key = (-r.prefix_hit_blocks(req), loads[k], k)
            if best_key is None or key < best_key:
                best, best_key = k, key
        return best


ROUTERS = {
    r.name: r for r in (RoundRobinRouter, LeastRequestsRouter, LeastKVRouter, PrefixAwareRouter)
}


def make_router(name: str, max_imbalance: int = DEFAULT_MAX_IMBALANCE):
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}: choose one of {', '.join(ROUTERS)}")
    if name == PrefixAwareRouter.name:
        return PrefixAwareRouter(max_imbalance)
    return ROUTERS[name]()
