"""How a run's load is generated: how many workers, where (processes here, or Ray), and which
requests each one sends."""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cbbench.errors import UsageError

AUTO = "auto"
MAX_WORKERS = 1024  # more is a typo, not a load test


def parse_workers(text: str | int) -> int | str:
    """'N' (>= 1) or 'auto'."""
    if isinstance(text, int):
        value = text
    elif text.strip().lower() == AUTO:
        return AUTO
    else:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"invalid --workers {text!r}: a number >= 1 or 'auto'") from None
    if not 1 <= value <= MAX_WORKERS:
        raise UsageError(f"invalid --workers {value}: between 1 and {MAX_WORKERS}, or 'auto'")
    return value


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class LoadPlan:
    workers: int | str = 1  # N, or "auto"
    ray: bool = False
    ray_address: str | None = None  # None: start a local Ray instance (with --ray)

    @property
    def distributed(self) -> bool:
        """False: the one-process run, in this process."""
        return self.ray or self.workers != 1

    def validate(self) -> LoadPlan:
        workers = parse_workers(self.workers)
        if isinstance(workers, int) and not self.ray:  # Ray places its actors on a cluster
            from cbbench.load.limits import check_worker_count

            check_worker_count(workers, f"--workers {workers}")
        if self.ray_address is not None and not self.ray:
            raise UsageError("--ray-address needs --ray")
        if self.ray_address is not None and not self.ray_address.strip():
            raise UsageError("--ray-address is empty: give the cluster's address (or 'auto')")
        return self

    def to_config(self, resolved_workers: int) -> dict:
        return {
            "workers": resolved_workers,
            "workers_requested": self.workers,
            "ray": self.ray,
            "ray_address": self.ray_address,
        }


def deal(
    num_requests: int, num_workers: int, sessions: Sequence[Hashable | None] | None = None
) -> list[list[int]]:
    """Which requests (positions in the run's request list) each worker sends: request i to
    worker i mod N; with sessions (multi-turn workloads: a session's turns depend on each
    other's answers, so one worker sends them all), whole sessions in turn, in the order of
    their first request, and requests without a session one by one among them."""
    shares: list[list[int]] = [[] for _ in range(num_workers)]
    if sessions is None:
        for i in range(num_requests):
            shares[i % num_workers].append(i)
        return shares
    if len(sessions) != num_requests:
        raise ValueError(f"{num_requests} requests but {len(sessions)} session keys")
    owner: dict[Hashable, int] = {}
    turn = 0  # the next worker in turn, over sessions and session-less requests alike
    for i, key in enumerate(sessions):
        if key is None:
            worker = turn % num_workers
            turn += 1
        elif key in owner:
            worker = owner[key]
        else:
            worker = owner[key] = turn % num_workers
            turn += 1
        shares[worker].append(i)
    return shares
