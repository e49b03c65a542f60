"""Clocks for the engine loop: real time for real execution, virtual time for simulation.

Times are seconds since the run started. ``advance_to`` is how an executor's predicted duration
takes effect: the virtual clock jumps; the real-time simulated clock sleeps until then (so a
``cbbench serve --engine sim`` serves H200-like timing to real clients).
"""

from __future__ import annotations

import time


class VirtualClock:
    """Deterministic time: jumps to the next arrival or iteration end."""

    realtime = False

    def __init__(self) -> None:
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> None:
        if t > self._t:
            self._t = t

    sleep_until = advance_to

    def begin_step(self, back_to_back: bool) -> None:
        """Called by the loop just before each step (a pacing clock uses it; this one not)."""


class WallClock:
    """Real time since construction (or ``reset``)."""

    realtime = True

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def reset(self) -> None:
        self._t0 = time.perf_counter()

    @property
    def origin(self) -> float:
        """perf_counter() at t = 0, to put other timestamps on this clock."""
        return self._t0

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def begin_step(self, back_to_back: bool) -> None:
        """Called by the loop just before each step (a pacing clock uses it; this one not)."""

    def advance_to(self, t: float) -> None:
        # Real executors take real time; a simulated executor on a wall clock sleeps out its
        # predicted duration.
        self.sleep_until(t)
