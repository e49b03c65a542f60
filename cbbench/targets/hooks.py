"""How a load-generator worker (cbbench/distributed) joins an HTTP run: the run's clock origin
comes from outside (one start instant shared by every worker), and each request's finished
record goes out as soon as the request ends (streamed to the parent, not one list at the end)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cbbench.analysis.records import RequestRecord


@dataclass(frozen=True)
class RunHooks:
    # Awaited once the client is set up (connection pool, served model), right before the
    # first request could go out; returns the run's t0 (a time.perf_counter() instant, which
    # may lie in the future: the dispatcher waits for it).
    start_at: Callable[[], Awaitable[float]] | None = None
    # Called from the event loop with (position in the run's request list, the finished
    # record, its token-count method) for every request that was sent. Must be quick.
    on_record: Callable[[int, RequestRecord, str], None] | None = None
    # False: a record handed to on_record is not kept for the run's end (a worker streams
    # them all out; a long run then holds only the requests in flight). run_http's own records
    # and record-based figures are then empty: the receiver computes them.
    keep_records: bool = True
    # Called once with the runner when its clock (runner.t0) is set: a live view reads its
    # counters (in_flight, finished) on its own timer (targets/live.py).
    on_run: Callable[[object], None] | None = None
