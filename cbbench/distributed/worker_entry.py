"""One entry of summary.workers: what one load-generating process sent, how it ended, and how
well it kept up. A multi-worker run has one per worker (distributed/merge.py); a one-process
run has one too (distributed/run.py), so both results have one form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from cbbench.analysis.records import RequestRecord
from cbbench.targets.http import send_lag_check

MS = 1000.0


@dataclass(frozen=True)
class ClientFigures:
    """The figures of one client process that its run_http info holds and the parent reads
    (a worker's Done.info, or the one-process run's info). A key the info lacks keeps its
    default: what the dict's reader took for it."""

    loop_lag_p50_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    loop_lag_span_s: float | None = None
    client_bound: bool = False
    client_cpu_s: float | None = None
    client_cpu_util: float | None = None
    max_in_flight: int | None = None
    connection_pool_size: int = 0
    connection_pool_capped: bool | None = None
    prompt_kinds: dict[str, int] | None = None  # prompts by kind (text, token_ids, decoded)

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> ClientFigures:
        """The figures ``info`` holds (its other keys are the run's, not this process's)."""
        return cls(**{f.name: info[f.name] for f in fields(cls) if f.name in info})


@dataclass
class WorkerEntry:
    """One summary.workers entry; :meth:`to_dict` is its JSON, keys in this order."""

    worker: int
    status: str  # merge.py's states: starting, ready, done, died, failed
    pid: int | None
    host: str | None
    assigned: int  # requests (or turns) in its share
    sent: int
    completed: int
    failed: int
    cancelled: int
    lost: int  # due before it died, unreported: counted as failed records
    not_sent: int
    send_lag_p50_ms: float | None
    send_lag_p99_ms: float | None
    client_fell_behind: bool
    loop_lag_p50_ms: float | None
    loop_lag_p99_ms: float | None
    client_bound: bool
    client_cpu_s: float | None
    client_cpu_util: float | None
    max_in_flight: int | None
    duration_s: float | None
    extra: dict = field(default_factory=dict)  # Ray: node, clock offset and uncertainty
    error: str | None = None  # why it died or failed

    def to_dict(self) -> dict:
        """The entry as the result holds it: the figures, Ray's extras after them, and the
        error last, only where there is one."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _TAIL}
        out.update(self.extra)
        if self.error is not None:
            out["error"] = self.error
        return out


_TAIL = ("extra", "error")  # written apart, after the figures


def worker_entry(
    worker: int,
    status: str,
    pid: int | None,
    host: str | None,
    assigned: int,
    recs: list[RequestRecord],
    figures: ClientFigures,
    lost: int,
    not_sent: int,
    duration_s: float | None,
    extra: dict | None = None,
    error: str | None = None,
) -> WorkerEntry:
    """One summary.workers entry, from the worker's records and its run_http figures."""
    completed = sum(r.ok for r in recs)
    failed = sum(r.error is not None for r in recs)
    cancelled = sum(r.cancelled and r.error is None for r in recs)
    lag = send_lag_check([(r.send_s - r.ready_s) * MS for r in recs if r.send_s is not None])
    return WorkerEntry(
        worker=worker,
        status=status,
        pid=pid,
        host=host,
        assigned=assigned,
        sent=completed + failed + cancelled,
        completed=completed,
        failed=failed,
        cancelled=cancelled,
        lost=lost,
        not_sent=not_sent,
        send_lag_p50_ms=lag["send_lag_p50_ms"],
        send_lag_p99_ms=lag["send_lag_p99_ms"],
        client_fell_behind=lag["client_fell_behind"],
        loop_lag_p50_ms=figures.loop_lag_p50_ms,
        loop_lag_p99_ms=figures.loop_lag_p99_ms,
        client_bound=figures.client_bound,
        client_cpu_s=figures.client_cpu_s,
        client_cpu_util=figures.client_cpu_util,
        max_in_flight=figures.max_in_flight,
        duration_s=duration_s,
        extra=dict(extra or {}),
        error=error,
    )
