"""What a live view of a run reads (issue 27, Build 6): counters the targets already keep, read
on the view's own timer (about twice a second), never pushed per token or per event.

A target hands the board what it has when its run starts: the HTTP runner (its in-flight and
finished counts and run clock), or the in-process engine (its iteration records and clock).
Finished requests reach the board as they end: the HTTP run's per-record hook, the engine's
per-step finished list (one list append each). Everything else (percentiles, rates) is
computed in ``snapshot()``, on the view's thread, over the requests ended since the last one.

Nothing here imports rich: the rendering is the CLI's (cbbench/cli/live.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from cbbench.analysis.summary.histogram import LogHistogram

if TYPE_CHECKING:
    from cbbench.engine.core.request import RequestStatus
    from cbbench.engine.sim.array_sim import ArraySim

MS = 1000.0
LIVE_RELATIVE_ERROR = 0.005  # the panel's p50s: within 0.5% (its figures show 3-4 digits)


@dataclass(frozen=True)
class LiveSnapshot:
    elapsed_s: float
    planned_s: float | None  # the schedule's last arrival (None: not known up front)
    total: int  # requests (or turns) the run plans to send
    sent: int
    in_flight: int
    done: int  # completed
    failed: int  # errors, rejections, cancellations
    target_rate: float | None  # req/s asked for (None: all at once, a trace, a ramp)
    achieved_rate: float | None  # sent / elapsed
    send_lag_p50_ms: float | None
    send_lag_max_ms: float | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    output_tok_s: float | None
    # The in-process engine's last iteration (None for an endpoint):
    running: int | None = None
    token_budget_use: float | None = None  # scheduled tokens / token budget
    kv_use: float | None = None  # KV blocks used / total


class _Tally:
    """The ended requests' figures so far: counts exactly, latencies in bounded-error
    histograms (analysis/summary/histogram.py), so a redraw costs O(new requests + buckets),
    not O(all requests so far): a p50 within LIVE_RELATIVE_ERROR."""

    def __init__(self) -> None:
        self.ttft_ms = LogHistogram(LIVE_RELATIVE_ERROR)
        self.tpot_ms = LogHistogram(LIVE_RELATIVE_ERROR)
        self.lag_ms = LogHistogram(LIVE_RELATIVE_ERROR)
        self.lag_max_ms: float | None = None
        self.done = 0
        self.failed = 0
        self.output_tokens = 0

    def add(self, ttft: list[float], tpot: list[float], lag: list[float]) -> None:
        self.ttft_ms.add_many(ttft)
        self.tpot_ms.add_many(tpot)
        if lag:
            self.lag_max_ms = max(self.lag_max_ms or 0.0, max(lag))
            self.lag_ms.add_many([max(0.0, x) for x in lag])  # a clock tick early: 0

    def records(self, recs) -> None:  # HTTP RequestRecords
        ttft, tpot, lag = [], [], []
        for rec in recs:
            if rec.send_s is not None:
                lag.append((rec.send_s - rec.ready_s) * MS)
            if not rec.ok:
                self.failed += 1
                continue
            self.done += 1
            self.output_tokens += rec.output_tokens
            ttft.append(rec.ttft_s * MS)
            if rec.tpot_s is not None:
                tpot.append(rec.tpot_s * MS)
        self.add(ttft, tpot, lag)

    def array_sim(self, ended, arrival, max_tokens) -> None:  # engine/sim/array_sim.py
        ttft, tpot = [], []
        for i, first, last in ended:
            self.done += 1
            m = max_tokens[i]
            self.output_tokens += m
            ttft.append((first - arrival[i]) * MS)
            if m > 1:
                tpot.append((last - first) / (m - 1) * MS)
        self.add(ttft, tpot, [])

    def requests(self, reqs, finished_status) -> None:  # engine Requests
        ttft, tpot = [], []
        for req in reqs:
            times = req.token_times
            if req.status != finished_status or not times:
                self.failed += 1
                continue
            self.done += 1
            self.output_tokens += req.num_output_tokens
            ttft.append((times[0] - req.arrival_time) * MS)
            if req.num_output_tokens > 1:
                tpot.append((times[-1] - times[0]) / (req.num_output_tokens - 1) * MS)
        self.add(ttft, tpot, [])


def _p50(h: LogHistogram) -> float | None:
    return h.percentiles([50])[0] if h.count else None


class _RunClock(Protocol):
    def now(self) -> float: ...


class _BoardEngine(Protocol):
    """What the board reads of the in-process run's engine (one engine, a replica set or a
    disaggregated pair: each has a clock, and the board reads its members' records)."""

    @property
    def clock(self) -> _RunClock: ...


class _BoardHttp(Protocol):
    """What the board reads of the HTTP runner (targets/http.py)."""

    t0: float
    in_flight: int


class LiveBoard:
    """Filled by the target, read by the view. ``plan()`` comes from the run (its schedule),
    ``attach_http()``/``attach_engine()`` from the target when its clock starts."""

    def __init__(self) -> None:
        self.total = 0
        self.planned_s: float | None = None
        self.target_rate: float | None = None
        self._ended: list = []  # appended by the target's thread, read by the view's
        self._cursor = 0
        self._tally = _Tally()
        self._http: _BoardHttp | None = None
        self._engine: _BoardEngine | None = None
        self._finished_status: RequestStatus | None = None
        self._progress = (0, 0)  # (done, total): all a multi-worker run reports
        self._array: ArraySim | None = None  # the array simulator (large simulated runs)

    def plan(self, total: int, planned_s: float | None, target_rate: float | None) -> None:
        self.total = total
        self.planned_s = planned_s
        self.target_rate = target_rate if target_rate and np.isfinite(target_rate) else None

    # The target's side (cheap: called on its own thread) -------------------------------

    def on_progress(self, done: int, total: int) -> None:
        self._progress = (done, total)

    def attach_http(self, runner) -> None:
        """The HTTP runner, once its clock (runner.t0) is set."""
        self._http = runner

    def on_record(self, pos: int, rec, method: str) -> None:
        """RunHooks.on_record: an HTTP request ended."""
        self._ended.append(rec)

    def attach_engine(self, engine) -> None:
        from cbbench.engine.core.request import RequestStatus

        self._finished_status = RequestStatus.FINISHED
        self._engine = engine

    def attach_array_sim(self, sim) -> None:
        """The array simulator (engine/sim/array_sim.py): no request objects; it lists each
        finished request's index and token times, and its replicas' counts."""
        sim.ended = []
        self._array = sim

    def on_finished(self, requests: list) -> None:
        """The engine's step finished these requests (or rejected them)."""
        self._ended.extend(requests)

    # The view's side -------------------------------------------------------------------

    def snapshot(self) -> LiveSnapshot:
        elapsed, in_flight, engine, done, failed = (
            self._read_array_sim() if self._array is not None else self._read_ended())
        tally = self._tally
        sent = done + failed + in_flight
        return LiveSnapshot(
            elapsed_s=elapsed,
            planned_s=self.planned_s,
            total=self.total or self._progress[1],
            sent=sent,
            in_flight=in_flight,
            done=done,
            failed=failed,
            target_rate=self.target_rate,
            achieved_rate=sent / elapsed if elapsed > 0 else None,
            send_lag_p50_ms=_p50(tally.lag_ms),
            send_lag_max_ms=tally.lag_max_ms,
            ttft_p50_ms=_p50(tally.ttft_ms),
            tpot_p50_ms=_p50(tally.tpot_ms),
            output_tok_s=tally.output_tokens / elapsed if elapsed > 0 else None,
            **engine,
        )

    def _read_ended(self) -> tuple[float, int, dict, int, int]:
        """The ended requests (HTTP records, engine Requests) since the last read, then
        (elapsed, in flight, engine figures, done, failed)."""
        ended = self._ended
        n = len(ended)  # a list only grows: read its length once, then the new items
        tally = self._tally
        new = ended[self._cursor:n]
        if self._engine is not None:
            tally.requests(new, self._finished_status)
        else:
            tally.records(new)
        self._cursor = n
        elapsed, in_flight, engine = self._clock_and_flight()
        done, failed = tally.done, tally.failed
        if self._engine is not None:  # refused at admission: never in a step's finished
            failed += sum(len(e.rejected) for e in getattr(self._engine, "engines", [self._engine]))
            # The last step's running count still holds the requests it finished (counted
            # done above): at the run's end that read "sent 31 of 30". Never more in flight
            # than the plan has left.
            if self.total:
                in_flight = max(0, min(in_flight, self.total - done - failed))
        elif self._http is None:  # workers: their progress only
            done = self._progress[0]
        return elapsed, in_flight, engine, done, failed

    def _read_array_sim(self) -> tuple[float, int, dict, int, int]:
        """The array simulator's finished requests since the last read, and its counts."""
        sim = self._array
        assert sim is not None  # snapshot() reads the array simulator only once attached
        ended = sim.ended
        assert ended is not None  # attach_array_sim set it
        n = len(ended)
        self._tally.array_sim(ended[self._cursor:n], sim.arrival, sim.max_tokens)
        self._cursor = n
        elapsed, in_flight, engine = sim.live_state()
        return elapsed, in_flight, engine, self._tally.done, len(sim.errors)

    def _clock_and_flight(self) -> tuple[float, int, dict]:
        if self._http is not None:
            r = self._http
            return (time.perf_counter() - r.t0 if r.t0 else 0.0), r.in_flight, {}
        if self._engine is None:
            return 0.0, 0, {}
        engines = getattr(self._engine, "engines", [self._engine])
        last = [e.records[-1] for e in engines if len(e.records)]
        if not last:
            return self._engine.clock.now(), 0, {}
        budget = sum(it.token_budget for it in last)
        kv_total = sum(it.kv_blocks_total for it in last)
        scheduled = sum(it.num_prefill_tokens + it.num_decode_tokens for it in last)
        return self._engine.clock.now(), sum(it.num_running + it.num_waiting for it in last), {
            "running": sum(it.num_running for it in last),
            "token_budget_use": scheduled / budget if budget else None,
            "kv_use": sum(it.kv_blocks_used for it in last) / kv_total if kv_total else None,
        }
