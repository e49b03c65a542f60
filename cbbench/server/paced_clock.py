"""Real-time pacing of a simulated engine behind `cbbench serve`."""

from __future__ import annotations

from cbbench.engine.core.clock import WallClock

# Catch-up is capped: a server too loaded to keep the simulated pace falls behind visibly
# instead of bursting iterations to recover.
MAX_CATCH_UP_S = 0.005


class PacedWallClock(WallClock):
    """A wall clock for a simulated engine that keeps back-to-back iterations on the simulated
    timeline. The time between two steps (the bridge's hand-over, the engine's own Python, the
    sleep's wake-up latency) is not in the predicted iteration time, so a plain wall clock runs
    every iteration that much long (measured here: +10-25% on a 1 ms decode). This clock ends
    an iteration that started late by that lag (up to MAX_CATCH_UP_S) on its ideal end."""

    def __init__(self) -> None:
        super().__init__()
        self._ideal_end: float | None = None
        self._lag = 0.0

    def begin_step(self, back_to_back: bool) -> None:
        """Called just before ``engine.step()``; ``back_to_back`` when no idle wait came between
        this step and the last one."""
        if back_to_back and self._ideal_end is not None:
            self._lag = min(max(self.now() - self._ideal_end, 0.0), MAX_CATCH_UP_S)
        else:
            self._lag = 0.0

    def advance_to(self, t: float) -> None:
        target = t - self._lag
        self._ideal_end = target
        self.sleep_until(target)
