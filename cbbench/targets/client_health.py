"""Is the client itself the bottleneck? The receiving side of the question.

Send lag (http.py) shows a client that could not send on time. A client whose event loop is
saturated also *reads* late: token events wait in the socket until the loop gets to them, then
come out in a burst, so TTFT reads high and TPOT/ITL read wrong (bursts: low TPOT, ITL near 0
then one long gap) while the send lag can still look fine. A heartbeat task measures it all run
long: it asks the loop to wake it every HEARTBEAT_INTERVAL_S and notes how late it woke. Every
token read in the same loop is delayed by the same lag, so its distribution bounds the error
of each token timestamp. Above a limit the latency figures are marked client-bound.

asyncio's own floor: the epoll selector rounds each wait up to a whole millisecond, so an idle
loop wakes 0-1 ms late (p50 ~0.5 ms); the limits sit well above that floor.

Also here: the client's CPU time over the run (all threads of this process) and the wall-clock
instant of the schedule's zero (epoch seconds, microseconds), so request times can be matched
to a server's log.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Sequence

import numpy as np

HEARTBEAT_INTERVAL_S = 0.01
# Limits on the loop's wake-up lag: above either, token timestamps carry that much client
# delay. p50 2 ms: twice the selector's 1 ms rounding; p99 10 ms: a TPOT of ~20 ms would be
# misread by half for the requests read in those stalls.
LOOP_LAG_P50_LIMIT_MS = 2.0
LOOP_LAG_P99_LIMIT_MS = 10.0
# A verdict needs the heartbeat to have run this long: in a shorter run the p99 is a handful
# of samples, and one set-up stall (loading TLS certificates: ~50 ms) would decide it. (Time,
# not a sample count: a badly stalled loop takes few samples, and must not escape the verdict.)
LOOP_LAG_MIN_SPAN_S = 1.0
# The latency figures a lagging loop distorts: every token is read late or in bursts.
CLIENT_BOUND_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
# The figures a client that fell behind its schedule distorts: they count from the intended start.
FELL_BEHIND_METRICS = ("ttft_ms", "e2el_ms")
EPOCH_DECIMALS = 6  # microseconds
MS = 1000.0


def wall_clock_of(t_perf: float) -> float:
    """The epoch time (µs resolution) of a time.perf_counter() instant. The two clocks' offset
    is the best of several bracketed reads (cbbench/clock_offset.py): two reads back to back are
    off by however long the process was descheduled between them, which on a busy host is
    milliseconds, and the request log's join (audit, the TTFT breakdown) inherits it."""
    from cbbench.clock_offset import perf_minus_epoch

    return round(t_perf - perf_minus_epoch(), EPOCH_DECIMALS)


async def sleep_until(deadline: float) -> None:
    """Sleep until time.perf_counter() reaches ``deadline``, never returning before it.

    One asyncio.sleep is not enough: uvloop (which Ray installs in its actors when it is
    importable, and cbbench depends on it) rounds a timer to whole milliseconds and fires it up
    to ~1 ms early, which would send a request before its slot and read a negative send lag.
    """
    now = time.perf_counter
    while (delay := deadline - now()) > 0:
        await asyncio.sleep(delay)


class ClientMonitor:
    """The heartbeat (run it as a task in the run's event loop) and the client's CPU time."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.t0_epoch_s = wall_clock_of(t0)
        self.lag_ms: array = array("d")
        self.span_s = 0.0  # from the first heartbeat's start to the last wake-up
        self._cpu0 = time.process_time()
        self._cpu_s: float | None = None

    async def run(self) -> None:
        now = time.perf_counter
        started = now()
        deadline = started + HEARTBEAT_INTERVAL_S
        while True:
            await sleep_until(deadline)
            woke = now()
            self.lag_ms.append((woke - deadline) * MS)
            self.span_s = woke - started
            deadline = woke + HEARTBEAT_INTERVAL_S  # no catch-up burst after a stall

    def stop(self) -> None:
        """Freeze the CPU figure (call when the run ends)."""
        self._cpu_s = time.process_time() - self._cpu0

    def result(self, duration_s: float) -> dict:
        cpu = self._cpu_s if self._cpu_s is not None else time.process_time() - self._cpu0
        return {
            "t0_epoch_s": self.t0_epoch_s,
            "client_cpu_s": cpu,
            "client_cpu_util": cpu / duration_s if duration_s > 0 else None,
            **loop_lag_check(self.lag_ms, self.span_s),
        }


def loop_lag_check(lag_ms: Sequence[float], span_s: float) -> dict:
    """Percentiles of the loop's wake-up lag (heartbeats over `span_s` seconds), and whether it
    makes the client the bottleneck."""
    if not len(lag_ms):
        return {
            "loop_lag_p50_ms": None,
            "loop_lag_p99_ms": None,
            "loop_lag_max_ms": None,
            "loop_lag_span_s": span_s,
            "client_bound": False,
        }
    a = np.asarray(lag_ms, dtype=np.float64)
    p50, p99 = (float(v) for v in np.percentile(a, [50, 99]))
    out: dict[str, float | bool | str] = {
        "loop_lag_p50_ms": p50,
        "loop_lag_p99_ms": p99,
        "loop_lag_max_ms": float(a.max()),
        "loop_lag_span_s": span_s,
        "client_bound": span_s >= LOOP_LAG_MIN_SPAN_S
        and (p50 > LOOP_LAG_P50_LIMIT_MS or p99 > LOOP_LAG_P99_LIMIT_MS),
    }
    if out["client_bound"]:
        out["client_bound_message"] = (
            f"the client's event loop lagged (p50 {p50:.1f} ms, p99 {p99:.1f} ms; limits "
            f"{LOOP_LAG_P50_LIMIT_MS:g} / {LOOP_LAG_P99_LIMIT_MS:g} ms): token times were read "
            "late or in bursts, so TTFT, TPOT, ITL and E2EL describe the client as much as the "
            "server. Spread the load over more client processes with --workers N (or --ray)."
        )
    return out


def client_bound_summary(info: dict) -> dict:
    """summary.client_bound: which latency figures the client distorted, and why."""
    metrics: list[str] = []
    reasons: list[str] = []
    if info.get("client_bound"):
        metrics += CLIENT_BOUND_METRICS
        reasons.append(info["client_bound_message"])
    if info.get("client_fell_behind"):
        metrics += [m for m in FELL_BEHIND_METRICS if m not in metrics]
        reasons.append(info["client_fell_behind_message"])
    return {"metrics": metrics, "reasons": reasons}
