"""Clock offsets between the driver and a worker on another machine, by round-trip exchange
(Cristian's algorithm, best of several rounds): the driver reads its clock (t1), asks the worker
for its clock (tw), reads its clock again (t2). The worker read its clock somewhere between t1
and t2 on the driver's clock, so offset = (t1 + t2) / 2 - tw is off by at most (t2 - t1) / 2,
whatever the asymmetry of the two legs. The round with the shortest round trip gives the
tightest bound. All clocks are time.perf_counter() (monotonic: never stepped by NTP)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

CLOCK_ROUNDS = 16
UNCERTAINTY_FLAG_MS = 1.0  # a worker whose offset is known less well than this is flagged
MS = 1000.0


@dataclass(frozen=True)
class ClockOffset:
    offset_s: float  # driver clock - worker clock
    uncertainty_s: float  # |true offset - offset_s| <= this
    rtt_s: float  # the best round trip

    def to_dict(self) -> dict:
        return {
            "clock_measured_offset_ms": self.offset_s * MS,
            "clock_measured_uncertainty_ms": self.uncertainty_s * MS,
            "clock_rtt_ms": self.rtt_s * MS,
        }


def measure_offset(
    read_remote: Callable[[], float],
    rounds: int = CLOCK_ROUNDS,
    now: Callable[[], float] = time.perf_counter,
) -> ClockOffset:
    best: tuple[float, float] | None = None  # (rtt, offset)
    for _ in range(rounds):
        t1 = now()
        tw = read_remote()
        t2 = now()
        rtt = t2 - t1
        if best is None or rtt < best[0]:
            best = (rtt, (t1 + t2) / 2.0 - tw)
    assert best is not None, "rounds must be >= 1"
    rtt, offset = best
    return ClockOffset(offset, rtt / 2.0, rtt)


def perf_minus_epoch() -> float:
    """time.perf_counter() - time.time() on this host, within a microsecond or so: the epoch
    read between two perf_counter reads, the tightest of CLOCK_ROUNDS. The request log and the
    client both move their perf_counter times to the epoch with it, so times from the two
    processes compare on one host."""
    return measure_offset(time.time).offset_s
