"""How a run's load is generated: how many workers, where (processes here, or Ray), and which
requests each one sends."""

from __future__ import annotations

import heapq
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cbbench.errors import UsageError

AUTO = "auto"
MAX_WORKERS = 1024  # more is a typo, not a load test
PREFILL_WORK = 1  # a request's prefill, in output tokens' time, when dealing slots' work


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


def slot_owners(num_workers: int, max_concurrency: int | None = None) -> list[int]:
    """The worker that holds each of --max-concurrency's slots: slot j to worker j mod N, so
    worker k holds cap // N + (k < cap % N) of them (its share of the one global cap). Without
    a cap (or with fewer slots than workers, which worker_tasks refuses), one slot each."""
    if max_concurrency is None or max_concurrency < num_workers:
        return list(range(num_workers))
    return [j % num_workers for j in range(max_concurrency)]


def deal(
    num_requests: int,
    num_workers: int,
    sessions: Sequence[Hashable | None] | None = None,
    max_concurrency: int | None = None,
    output_lens: Sequence[int] | None = None,
) -> list[list[int]]:
    """Which requests (positions in the run's request list) each worker sends: request i to
    worker i mod N. Under --max-concurrency, each request in turn to the slot (slot_owners)
    with the least work dealt so far, as one process's global cap hands it the first slot to
    free: each worker so sends in proportion to its slots (and, given `output_lens`, to their
    work: a request's time in its slot taken as its output tokens plus one for its prefill;
    the server's TTFT/ITL ratio is unknown before the run). Dealt evenly, the worker with 1 of
    3 slots sent as many requests as the one with 2 and ran alone at concurrency 1 at the end
    (40 requests: 5.27 s, where one process took 3.47 s). With sessions (multi-turn workloads:
    a session's turns depend on each other's answers, so one worker sends them all), whole
    sessions in turn (under a cap, in proportion to the slots), in the order of their first
    request, and requests without a session one by one among them."""
    shares: list[list[int]] = [[] for _ in range(num_workers)]
    owners = slot_owners(num_workers, max_concurrency)
    if sessions is None:
        if max_concurrency is None:
            for i in range(num_requests):
                shares[i % num_workers].append(i)
            return shares
        free = [(0, j) for j in range(len(owners))]  # (work dealt, slot): equal work, in turn
        for i in range(num_requests):
            work, j = heapq.heappop(free)
            shares[owners[j]].append(i)
            cost = output_lens[i] + PREFILL_WORK if output_lens is not None else 1
            heapq.heappush(free, (work + cost, j))
        return shares
    if len(sessions) != num_requests:
        raise ValueError(f"{num_requests} requests but {len(sessions)} session keys")
    owner: dict[Hashable, int] = {}
    turn = 0  # the next worker in turn, over sessions and session-less requests alike
    for i, key in enumerate(sessions):
        if key is None:
            worker = owners[turn % len(owners)]
            turn += 1
        elif key in owner:
            worker = owner[key]
        else:
            worker = owner[key] = owners[turn % len(owners)]
            turn += 1
        shares[worker].append(i)
    return shares
