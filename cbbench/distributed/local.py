"""--workers N: worker processes on this machine.

One start instant for all: time.perf_counter() is CLOCK_MONOTONIC on Linux (see
time.get_clock_info), one clock for the whole system, the same in every process. So the parent
picks t0 = now + START_MARGIN_S on its own clock once every worker is set up, sends that number,
and each worker uses it as is: request times relative to t0 need no conversion. (Other systems:
macOS's perf_counter is mach_absolute_time, also system-wide; Windows' QueryPerformanceCounter
too.)

Processes are spawned, not forked: the parent may hold threads (GPU telemetry) and torch, which
a fork would copy half-way. Each worker has two pipes, control (parent -> worker) and data
(worker -> parent), so a worker killed mid-write corrupts only its own stream; the parent waits
on all data pipes and process sentinels at once (multiprocessing.connection.wait). A worker
that exits without its Done is dead: what it had streamed is kept, the rest is accounted
(merge.py).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Protocol

from cbbench.distributed.merge import FINAL, STARTING, Merger
from cbbench.distributed.messages import WorkerTask
from cbbench.distributed.parent_scrape import ParentScrape
from cbbench.distributed.plan import deal, slot_owners
from cbbench.distributed.session_share import deal_sessions
from cbbench.distributed.worker import process_main
from cbbench.errors import UsageError
from cbbench.load.cancel import CancelPlan
from cbbench.load.session_plan import SessionPlan
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.http import HttpRun
from cbbench.targets.options import EndpointOptions

log = logging.getLogger(__name__)

START_MARGIN_S = 0.2  # from t0's choice to t0: the start message reaches every worker first
SETUP_TIMEOUT_S = 120.0  # spawn, imports, prompts, the served-model look-up
POLL_S = 0.05  # the wait's timeout: how often a stop request and progress are checked
JOIN_TIMEOUT_S = 5.0


def plan_workers(
    opts: EndpointOptions,
    wreqs: list[WorkloadRequest],
    arrivals,
    num_workers: int,
    grace_s: float,
    sessions: SessionPlan | None = None,
    cancel: CancelPlan | None = None,
) -> tuple[list[WorkerTask], Merger]:
    """Deal the run to `num_workers` (fewer when there is less to deal: no idle workers):
    request i to worker i mod N, or whole sessions in turn; under --max-concurrency, in
    proportion to each worker's slots (plan.deal). The same for processes and Ray."""
    cap = opts.max_concurrency
    if sessions is None:
        n = max(1, min(num_workers, len(wreqs)))
        shares = deal(len(wreqs), n, max_concurrency=cap,
                      output_lens=[w.output_len for w in wreqs])
        session_shares = None
    else:
        n = max(1, min(num_workers, len(sessions.sessions)))
        shares, session_shares = deal_sessions(sessions, n, cap)
    tasks = worker_tasks(opts, wreqs, arrivals, shares, grace_s, sessions, session_shares, cancel)
    merger = Merger(wreqs, [float(a) for a in arrivals], shares, sessions, session_shares)
    return tasks, merger


def worker_tasks(
    opts: EndpointOptions,
    wreqs: list[WorkloadRequest],
    arrivals,
    shares: list[list[int]],
    grace_s: float,
    sessions: SessionPlan | None = None,
    session_shares: list[list[int]] | None = None,
    cancel: CancelPlan | None = None,
) -> list[WorkerTask]:

    """Each worker's share: its requests and arrival times (or its sessions) and its share of
    --max-concurrency; no worker scrapes /metrics (the parent does, over the whole run)."""
    n = len(shares)
    cap = opts.max_concurrency
    if cap is not None and cap < n:
        raise UsageError(f"--max-concurrency {cap} is less than --workers {n}: one slot each")
    owners = slot_owners(n, cap)  # the slots the requests were dealt by (plan.deal)
    tasks = []
    for k, share in enumerate(shares):
        o = dataclasses.replace(
            opts,
            max_concurrency=None if cap is None else owners.count(k),
            scrape_metrics=False,
        )
        if sessions is not None:
            assert session_shares is not None  # dealt with the sessions (local_run)
            mine = dataclasses.replace(sessions, active=session_shares[k])
            tasks.append(WorkerTask(k, o, share, [], [], grace_s, mine, cancel))
            continue
        tasks.append(
            WorkerTask(
                k,
                o,
                share,
                [wreqs[p] for p in share],
                [float(arrivals[p]) for p in share],
                grace_s,
                cancel=cancel,
            )
        )
    return tasks


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "vanished"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class WorkerPool(Protocol):
    """One run's workers as the parent drives them (processes here, Ray actors: ray_pool.py)."""

    def start(self) -> float:
        """Start every set-up worker at one instant, a time.perf_counter() value: t0."""

    def stop(self) -> None:
        """Tell every worker still running to stop dispatching."""

    def poll(self, t0: float | None) -> None:
        """Hand what the workers sent (and any worker's death) to the merger; wait up to
        POLL_S for it."""


def drive(pool: WorkerPool, merger: Merger, opts: EndpointOptions,
          should_stop: Callable[[], bool] | None, on_progress: Callable[[int, int], None] | None,
          on_t0: Callable[[float], None] | None, setup_timeout_s: float, who: str,
          cpu0: float) -> HttpRun:
    """The parent's loop, the same for processes and Ray actors: once every worker is set up
    (or gone) start them all at one instant, pass a stop on, take what they send until each
    one is final, then merge. A worker's bad input, and a set-up past its deadline, are
    refused; ``cpu0``: the parent's CPU time when the run began."""
    t0: float | None = None
    stop_sent = False
    deadline = time.monotonic() + setup_timeout_s
    # /metrics from here, over the whole run (parent_scrape.py), not from one worker.
    scrape = ParentScrape(opts) if opts.scrape_metrics else None
    try:
        while not merger.all_final:
            if t0 is None:
                if merger.usage_error is not None:
                    raise UsageError(merger.usage_error)
                if should_stop is not None and should_stop():
                    break  # stopped during set-up: nothing was sent
                if all(ws.status != STARTING for ws in merger.workers):
                    if scrape is not None:
                        scrape.baseline()  # the histograms before the run
                    t0 = pool.start()  # every worker is set up (or gone): one start instant
                    if scrape is not None:
                        scrape.start(t0)
                    if on_t0 is not None:
                        on_t0(t0)
                elif time.monotonic() > deadline:
                    raise UsageError(f"the {who} did not get ready within {setup_timeout_s:g} s")
            elif not stop_sent and should_stop is not None and should_stop():
                stop_sent = True
                pool.stop()
            pool.poll(t0)
            if on_progress is not None and t0 is not None:
                on_progress(merger.finished, merger.total)
        scraped = scrape.finish() if scrape is not None else {}  # every worker is done
    finally:
        if scrape is not None:
            scrape.close()
    if t0 is None:
        t0 = time.perf_counter()  # nothing was sent: the run starts and ends now
    return merger.result(opts, t0, stop_sent or t0 is None, time.process_time() - cpu0,
                         scraped)


def run_local_workers(
    opts: EndpointOptions,
    tasks: list[WorkerTask],
    merger: Merger,
    should_stop: Callable[[], bool] | None,
    on_progress: Callable[[int, int], None] | None,
    on_t0: Callable[[float], None] | None = None,
) -> HttpRun:
    pool = _LocalPool(merger)
    cpu0 = time.process_time()
    try:
        pool.spawn(tasks)
        return drive(pool, merger, opts, should_stop, on_progress, on_t0, SETUP_TIMEOUT_S,
                     "workers", cpu0)
    finally:
        pool.close()


class _LocalPool:
    """The worker processes of one run and their pipes."""

    def __init__(self, merger: Merger) -> None:
        self.merger = merger
        self.procs: list = []
        self.ctrls: list = []
        self.datas: list = []
        self.open_data: dict = {}

    def spawn(self, tasks: list[WorkerTask]) -> None:
        ctx = mp.get_context("spawn")
        for task in tasks:
            ctrl_r, ctrl_w = ctx.Pipe(duplex=False)
            data_r, data_w = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=process_main,
                args=(task, ctrl_r, data_w),
                name=f"cbbench-worker-{task.worker}",
                daemon=True,  # never outlive the parent
            )
            p.start()
            ctrl_r.close()  # the parent keeps only its own ends: EOF then means the peer is gone
            data_w.close()
            self.open_data[len(self.procs)] = data_r
            self.datas.append(data_r)
            self.procs.append(p)
            self.ctrls.append(ctrl_w)

    def _send_all(self, msg: tuple) -> None:
        for k, c in enumerate(self.ctrls):
            if self.merger.workers[k].status not in FINAL:
                _send(c, msg)

    def start(self) -> float:
        t0 = time.perf_counter() + START_MARGIN_S
        self._send_all(("start", t0))
        return t0

    def stop(self) -> None:
        self._send_all(("stop",))

    def poll(self, t0: float | None) -> None:
        """Take what the workers sent; note a process that ended with its pipe closed."""
        ready = wait(
            list(self.open_data.values())
            + [p.sentinel for k, p in enumerate(self.procs) if k not in self.open_data],
            timeout=POLL_S,
        )
        for obj in ready:
            k = next((k for k, d in self.open_data.items() if d is obj), None)
            if k is not None:
                try:
                    msg = self.open_data[k].recv()
                    self.merger.on_message(msg, _since(t0))
                except (EOFError, OSError):
                    del self.open_data[k]  # its pipe is closed: check the process next
                continue
            k = next(k for k, p in enumerate(self.procs) if p.sentinel == obj)
            self.procs[k].join(JOIN_TIMEOUT_S)
            self.merger.died(k, _since(t0) or 0.0, _signal_name(self.procs[k].exitcode))

    def close(self) -> None:
        for c in self.ctrls:
            c.close()
        for p in self.procs:
            p.join(JOIN_TIMEOUT_S if p.exitcode is None else 0)
            if p.is_alive():
                p.kill()
                p.join(JOIN_TIMEOUT_S)
        for d in self.datas:
            d.close()


def _since(t0: float | None) -> float | None:
    return time.perf_counter() - t0 if t0 is not None else None


def _send(conn, msg) -> None:
    try:
        conn.send(msg)
    except (BrokenPipeError, OSError):
        pass  # that worker is gone: its sentinel says so
