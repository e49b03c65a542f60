"""Cancellation as a load pattern: --cancel-rate F --cancel-after DIST.

A share F of the requests is cancelled DIST milliseconds after it was sent, if it has not
finished by then (as AIPerf's request cancellation: the timer starts once the request is sent,
so the same request is cancelled at the same point of its life on every run). Over HTTP the
client closes the stream; the in-process engine aborts the request. Which requests, and after
how long, is decided per request id from the seed, the same on every target.

Cancelled requests are counted apart (summary.cancelled): they are neither completed nor
failed, stay out of the latency statistics, and their tokens are reported as work the server
did for nothing (summary.cancelled_work).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbbench.errors import UsageError
from cbbench.load.delays import Delay, parse_delay

CANCEL_STREAM = 31


@dataclass(frozen=True)
class CancelPlan:
    rate: float  # share of requests to cancel, in [0, 1]
    after: Delay  # when, from the send
    seed: int = 0

    def cancel_after_s(self, request_id: int) -> float | None:
        """Seconds after its send at which request ``request_id`` is cancelled; None: never."""
        rng = np.random.default_rng([self.seed, CANCEL_STREAM, request_id])
        if rng.random() >= self.rate:
            return None
        return self.after.sample_s(rng)

    def to_config(self) -> dict:
        return {"cancel_rate": self.rate, "cancel_after": self.after.text()}


def cancel_plan(rate: float | None, after: str | None, seed: int) -> CancelPlan | None:
    """The plan from --cancel-rate / --cancel-after (both needed together), or None."""
    if rate is None and after is None:
        return None
    if rate is None or after is None:
        raise UsageError("--cancel-rate and --cancel-after go together")
    if not 0 <= rate <= 1:
        raise UsageError(f"--cancel-rate must be between 0 and 1, got {rate}")
    return CancelPlan(rate, parse_delay(after, "--cancel-after"), seed)
