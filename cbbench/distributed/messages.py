"""What the parent and its workers tell each other. Workers send; the parent (the driver, for
Ray) merges. Plain dataclasses: pickled over a pipe or through Ray's object store."""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.analysis.records import RequestRecord
from cbbench.load.cancel import CancelPlan
from cbbench.load.session_plan import SessionPlan
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.checks import StreamNotes
from cbbench.targets.options import EndpointOptions


@dataclass
class WorkerTask:
    """One worker's share of the run."""

    worker: int
    opts: EndpointOptions  # its own copy: its share of --max-concurrency, no scraping
    positions: list[int]  # its requests' positions in the run's request list
    wreqs: list[WorkloadRequest]
    arrivals: list[float]  # seconds from the shared start instant
    grace_s: float
    # Multi-turn: the run's plan with this worker's sessions active (wreqs and arrivals are
    # then empty, and positions are its turns' request ids).
    sessions: SessionPlan | None = None
    cancel: CancelPlan | None = None  # the run's --cancel-rate plan (decided per request id)


@dataclass
class Ready:
    """Set up (prompts built, connection pool open, served model known): waiting for t0."""

    worker: int
    pid: int
    host: str


@dataclass
class RecordBatch:
    """The requests that ended since the last batch: (position, final record, token-count
    method)."""

    worker: int
    items: list[tuple[int, RequestRecord, str]]


@dataclass
class Done:
    """The worker's run is over; everything it sent has been reported in batches before this."""

    worker: int
    duration_s: float
    interrupted: bool
    info: dict  # its run_http info: send lag, loop lag, client CPU, served model, scrapes
    loop_lag_ms: list[float] = field(default_factory=list)
    sessions_ended_early: int = 0  # multi-turn: its sessions cut short by a failed turn
    # What it would have said on the console, for the parent to say once (merge.py): its
    # streams' notes, merged into one line a kind over every worker, and its other notices
    # (the /tokenize sizing's), each said once however many workers said it.
    notes: StreamNotes | None = None
    notices: list[str] = field(default_factory=list)


@dataclass
class Failed:
    """The worker could not run (usage: a bad option or an unreachable server) or crashed."""

    worker: int
    message: str
    usage: bool = False


Message = Ready | RecordBatch | Done | Failed
