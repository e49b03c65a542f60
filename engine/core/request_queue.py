"""The waiting queue under ``--policy priority``.

FCFS scheduling keeps a plain ``deque`` (new arrivals at the back, preempted requests at the
front). Priority scheduling orders the queue by ``(priority, arrival_time, queue_seq)``: lower
priority values first, ties by arrival. This heap offers the same surface the scheduler uses on
the deque, so the scheduler's code does not branch on the policy to use its queue; a preempted
request simply goes back to its place by key.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from .request import Request


def priority_key(req: Request) -> tuple[int, float, int]:
    return (req.priority, req.arrival_time, req.queue_seq)


class PriorityRequestQueue:
    __slots__ = ("_heap",)

    def __init__(self) -> None:
        # (key, request): queue_seq is unique, so the key alone orders entries.
        self._heap: list[tuple[tuple[int, float, int], Request]] = []

    def append(self, req: Request) -> None:
        heapq.heappush(self._heap, (priority_key(req), req))

    # A preempted request rejoins at its place by key, not at the front.
    appendleft = append

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("only the head of a priority queue can be read")
        return self._heap[0][1]

    def remove(self, req: Request) -> None:
        heap = self._heap
        for i, (_, r) in enumerate(heap):
            if r is req:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return
        raise ValueError(f"{req!r} is not waiting")

    def __contains__(self, req: object) -> bool:
        return any(r is req for _, r in self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In scheduling order."""
        return (r for _, r in sorted(self._heap, key=lambda e: e[0]))
