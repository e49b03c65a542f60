"""run_load: an HTTP run in this process (the default), in worker processes (--workers N) or
in Ray actors (--ray). Every path returns the same HttpRun, each record tagged with its
worker, and info["workers"] (summary.workers) with one entry per worker."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from cbbench.distributed.client_cost import (
    ONE_PROCESS_BUDGET_CORES,
    ClientCost,
    calibrate,
    schedule_rate,
)
from cbbench.distributed.merge import DONE
from cbbench.distributed.plan import AUTO, LoadPlan, usable_cores
from cbbench.distributed.worker_entry import ClientFigures, worker_entry
from cbbench.load.cancel import CancelPlan
from cbbench.load.interrupts import DEFAULT_GRACE_S
from cbbench.load.session_plan import SessionPlan
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.http import HttpRun, run_http
from cbbench.targets.options import EndpointOptions

log = logging.getLogger(__name__)


def run_load(
    opts: EndpointOptions,
    wreqs: list[WorkloadRequest],
    arrivals,
    plan: LoadPlan,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    on_t0: Callable[[float], None] | None = None,
    sessions: SessionPlan | None = None,
    cancel: CancelPlan | None = None,
    live=None,
) -> HttpRun:

    """`on_t0(t0)`: called once the run's start instant is chosen, a time.perf_counter()
    value (with workers, their shared one, up to START_MARGIN_S ahead; in one process the
    client's own t0, taken after its set-up). `sessions`: a multi-turn plan
    (run_http; with workers, whole sessions to each). `cancel`: the --cancel-rate plan, decided
    per request id, so every worker cancels its own requests as one process would. `live`: a
    LiveBoard (targets/live.py); in one process it reads the runner, with workers their
    progress only."""
    cost = _calibrated(opts, wreqs, arrivals, plan, sessions)
    if not plan.distributed:
        run = _one_process(
            opts, wreqs, arrivals, should_stop, on_progress, grace_s, sessions, cancel, live,
            on_t0,
        )
        _note_cost(run, cost, arrivals)
        return run
    if plan.ray:
        from cbbench.distributed.ray_pool import run_ray_workers

        run = run_ray_workers(
            opts, wreqs, arrivals, plan, should_stop, on_progress, grace_s, on_t0,
            sessions, cancel,
        )
    else:
        from cbbench.distributed.local import plan_workers, run_local_workers

        n = int(plan.workers) if plan.workers != AUTO else (
            cost.workers_for(schedule_rate(arrivals), usable_cores()) if cost is not None
            else 1)
        tasks, merger = plan_workers(opts, wreqs, arrivals, n, grace_s, sessions, cancel)
        run = run_local_workers(opts, tasks, merger, should_stop, on_progress, on_t0)
    _note_cost(run, cost, arrivals)
    return run


# Below this rate a process keeps the schedule even at 2 ms of CPU a request: no calibration
# (it costs ~0.1 s before the first request).
CALIBRATE_ABOVE_RATE = ONE_PROCESS_BUDGET_CORES / 2e-3


def _calibrated(opts, wreqs, arrivals, plan: LoadPlan, sessions) -> ClientCost | None:
    """The client's per-request cost (distributed/client_cost.py) where the schedule is fast
    enough for it to matter; None otherwise (and for sessions, Ray, the pooled APIs). A
    schedule one process cannot keep is said now, before the run starts."""
    rate = schedule_rate(arrivals)
    if (plan.ray or opts.pooling or sessions is not None or not wreqs
            or not rate > CALIBRATE_ABOVE_RATE):
        return None
    tokens = sum(w.output_len for w in wreqs) / len(wreqs)
    cost = calibrate(tokens)
    cores = usable_cores()
    workers = 1 if not plan.distributed else (
        cost.workers_for(rate, cores) if plan.workers == AUTO else int(plan.workers))
    per_process = cost.cores_at(rate) / workers
    if per_process > ONE_PROCESS_BUDGET_CORES:
        advice = (f"--workers {cost.workers_for(rate, cores)}" if workers < cores
                  else "a machine with more cores, or a lower rate")
        log.info(
            f"warning: this schedule ({rate:.0f} req/s, {tokens:.0f} output tokens a request) "
            f"needs at least {per_process:.2f} cores of each of {workers} client process(es): "
            f"this client costs at least {cost.per_request_s * 1e6:.0f} us of CPU a request "
            f"here (calibrated), so one process keeps a schedule to about "
            f"{cost.max_rate():.0f} req/s; expect send lag. Use {advice}."
        )
    return cost


def _note_cost(run: HttpRun, cost: ClientCost | None, arrivals) -> None:
    if cost is None:
        return
    run.info["client_calibration"] = {
        "us_per_request": cost.per_request_s * 1e6,
        "us_own_work": cost.request_s * 1e6,
        "us_per_read": cost.read_s * 1e6,
        "max_rate_one_process": cost.max_rate(),
        "cores_at_rate": cost.cores_at(schedule_rate(arrivals)),
    }


class SinceInstant:
    """A clock (for the GPU telemetry sampler) reading seconds since a perf_counter instant:
    the workers' shared t0, so samples and requests share one time axis."""

    def __init__(self, t0: float):
        self.t0 = t0

    def now(self) -> float:
        return time.perf_counter() - self.t0


def _one_process(
    opts,
    wreqs,
    arrivals,
    should_stop,
    on_progress,
    grace_s,
    sessions=None,
    cancel=None,
    live=None,
    on_t0: Callable[[float], None] | None = None,
) -> HttpRun:
    from cbbench.targets.hooks import RunHooks

    start_at = None
    if on_t0 is not None:
        async def start_at() -> float:  # run_http's t0, once its set-up is done
            t0 = time.perf_counter()
            on_t0(t0)
            return t0

    hooks = RunHooks(start_at=start_at, on_record=live.on_record if live else None,
                     on_run=live.attach_http if live else None)
    runner: Callable[..., HttpRun] = run_http
    if opts.pooling:  # imported here: the streamed APIs' start does not pay for it (issue 41)
        from cbbench.targets.apis.pooling_request import run_pooling

        runner = run_pooling
    run = runner(
        opts,
        wreqs,
        arrivals,
        should_stop=should_stop,
        on_progress=on_progress,
        grace_s=grace_s,
        sessions=sessions,
        cancel=cancel,
        hooks=hooks,
    )
    for rec in run.records:
        rec.worker = 0
    run.info["workers"] = [
        worker_entry(
            0,
            DONE,
            os.getpid(),
            socket.gethostname(),
            sessions.num_turns if sessions is not None else len(wreqs),
            run.records,
            ClientFigures.of(run.info),
            0,
            run.not_sent,
            run.duration_s,
        ).to_dict()
    ]
    return run
