"""--ray: the same workers as Ray actors, spread over a cluster's nodes (or a local Ray
instance, started and shut down here, when no --ray-address is given).

Each actor wraps a WorkerCore (worker.py). Its `run` method is a Ray streaming generator: it
yields the worker's messages in batches as they come (Ready, then a RecordBatch every
FLUSH_INTERVAL_S, then Done), so a long run never holds all its records in one actor. The
actor is threaded (max_concurrency), so the driver can read its clock, start and stop it while
`run` is streaming.

Clocks: once every actor is set up, the driver measures each one's offset to its own clock by
round-trip exchange (clock.py) and hands each actor the shared start instant on the actor's own
clock, t0 - offset; request times are relative to that t0, so they land on the driver's
timeline with the offset's uncertainty. An actor on the driver's own node shares its clock
(CLOCK_MONOTONIC is system-wide): it gets offset 0 exactly, and the measurement is recorded as a
check. An uncertainty above UNCERTAINTY_FLAG_MS is flagged in summary.workers and on stderr.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable

from cbbench.clock_offset import UNCERTAINTY_FLAG_MS, ClockOffset, measure_offset
from cbbench.distributed.local import POLL_S, START_MARGIN_S, drive, plan_workers
from cbbench.distributed.merge import FINAL, READY, Merger
from cbbench.distributed.messages import Done, Failed, WorkerTask
from cbbench.distributed.plan import AUTO, LoadPlan, usable_cores
from cbbench.distributed.worker import WorkerCore
from cbbench.errors import UsageError
from cbbench.load.cancel import CancelPlan
from cbbench.load.session_plan import SessionPlan
from cbbench.targets.http import HttpRun
from cbbench.targets.options import EndpointOptions

log = logging.getLogger(__name__)

RAY_MISSING = "--ray needs Ray: pip install 'cbbench[ray]'"
SETUP_TIMEOUT_S = 300.0  # actors scheduled and started on the cluster, set up
ACTOR_THREADS = 4  # run (streaming), now, start, stop
NAMESPACE = "cbbench"
# ray.init retries an unreachable GCS address for minutes: a plain TCP connect says it first.
CONNECT_CHECK_S = 5.0
MS = 1000.0


class LoadWorkerActor:
    """A Ray actor around one WorkerCore (made remote in run_ray_workers: Ray stays optional)."""

    def __init__(self, task: WorkerTask):
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._core = WorkerCore(task, self._out.put)

    def where(self) -> tuple[str, str, int]:
        import ray

        return ray.get_runtime_context().get_node_id(), socket.gethostname(), os.getpid()

    def now(self) -> float:
        return time.perf_counter()

    def start(self, t0: float) -> None:
        self._core.start(t0)

    def stop(self) -> None:
        self._core.stop()

    def run(self):
        """Stream the worker's messages, a list at a time, until its Done (or Failed)."""
        runner = threading.Thread(target=self._core.run, name="cbbench-run", daemon=True)
        runner.start()
        while True:
            batch = [self._out.get()]
            while True:
                try:
                    batch.append(self._out.get_nowait())
                except queue.Empty:
                    break
            yield batch
            if any(isinstance(m, (Done, Failed)) for m in batch):
                break
        runner.join()


def _init_ray(plan: LoadPlan):
    """(ray, started_here)."""
    try:
        import ray
    except ImportError:
        raise UsageError(RAY_MISSING) from None
    if ray.is_initialized():
        return ray, False
    if plan.ray_address is not None:
        check_reachable(plan.ray_address)
        try:
            ray.init(address=plan.ray_address, logging_level=logging.WARNING, namespace=NAMESPACE)
        except Exception as e:  # ConnectionError and Ray's own errors
            raise UsageError(f"cannot join the Ray cluster at {plan.ray_address}: {e}") from None
    else:
        ray.init(num_cpus=usable_cores(), include_dashboard=False, logging_level=logging.WARNING,
                 namespace=NAMESPACE)
    return ray, True


@contextlib.contextmanager
def shared_ray(plan: LoadPlan):
    """One Ray instance for several runs (the probes of a sweep or a capacity search): started
    or joined here, each run finds it initialized and leaves it up; shut down at the end if it
    was started here. Ray takes seconds to start: once, not once per probe."""
    ray, started_here = _init_ray(plan)
    try:
        yield
    finally:
        if started_here:
            ray.shutdown()


def check_reachable(address: str) -> None:
    """UsageError when a HOST:PORT cluster address does not accept a TCP connection ('auto' and
    ray:// client addresses are left to Ray)."""
    host, sep, port = address.strip().rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_CHECK_S).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UsageError(f"cannot reach the Ray cluster at {address}: {reason}") from None


def _reader(ray, k: int, gen, out: queue.SimpleQueue) -> None:
    """Move one actor's stream into `out`; ('died', reason) when the actor is lost."""
    try:
        for ref in gen:
            out.put((k, ray.get(ref)))
    except Exception as e:  # RayActorError, ActorDiedError, ...: the actor is gone
        out.put((k, ("died", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")))


def run_ray_workers(
    opts: EndpointOptions,
    wreqs,
    arrivals,
    plan: LoadPlan,
    should_stop: Callable[[], bool] | None,
    on_progress: Callable[[int, int], None] | None,
    grace_s: float,
    on_t0: Callable[[float], None] | None = None,
    sessions: SessionPlan | None = None,
    cancel: CancelPlan | None = None,
) -> HttpRun:
    ray, started_here = _init_ray(plan)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        # auto: one worker per CPU of the cluster, less one for this driver (which merges).
        n = max(1, cpus - 1) if plan.workers == AUTO else int(plan.workers)
        n = max(1, min(n, len(sessions.sessions) if sessions is not None else len(wreqs)))
        if n > cpus:
            raise UsageError(
                f"--workers {n} needs {n} CPUs but the Ray cluster has {cpus}: a worker that "
                "shares a core falls behind its schedule"
            )
        tasks, merger = plan_workers(opts, wreqs, arrivals, n, grace_s, sessions, cancel)
        remote = ray.remote(num_cpus=1, max_concurrency=ACTOR_THREADS)(LoadWorkerActor)
        run_id = uuid.uuid4().hex[:8]
        actors = [
            remote.options(name=f"worker-{run_id}-{t.worker}", scheduling_strategy="SPREAD").remote(
                t
            )
            for t in tasks
        ]
        try:
            return _drive(ray, actors, opts, merger, should_stop, on_progress, on_t0)
        finally:
            for a in actors:  # on a cluster that outlives this run, leave nothing behind
                ray.kill(a)
    finally:
        if started_here:
            ray.shutdown()


def _drive(ray, actors, opts, merger: Merger, should_stop, on_progress, on_t0) -> HttpRun:
    cpu0 = time.process_time()
    pool = _RayPool(ray, actors, merger)
    return drive(pool, merger, opts, should_stop, on_progress, on_t0, SETUP_TIMEOUT_S,
                 "Ray workers", cpu0)


class _RayPool:
    """One run's actors: where each runs, and one reader thread per actor moving its stream
    into a queue the driver takes from."""

    def __init__(self, ray, actors, merger: Merger) -> None:
        self.ray, self.actors, self.merger = ray, actors, merger
        try:
            self.where = ray.get([a.where.remote() for a in actors], timeout=SETUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise UsageError(
                f"the Ray actors did not start within {SETUP_TIMEOUT_S:g} s (cluster busy?)"
            ) from None
        self.here = ray.get_runtime_context().get_node_id()
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        for k, a in enumerate(actors):
            threading.Thread(target=_reader, args=(ray, k, a.run.remote(), self.out),
                             daemon=True).start()

    def stop(self) -> None:
        for k, a in enumerate(self.actors):
            if self.merger.workers[k].status not in FINAL:
                a.stop.remote()

    def poll(self, t0: float | None) -> None:
        """One batch the actors' reader threads queued (or a death), into the merger."""
        try:
            k, batch = self.out.get(timeout=POLL_S)
        except queue.Empty:
            return
        if isinstance(batch, tuple):  # ('died', reason)
            at = time.perf_counter() - t0 if t0 is not None else 0.0
            self.merger.died(k, at, batch[1])
        else:
            for msg in batch:
                self.merger.on_message(msg, time.perf_counter() - t0 if t0 is not None else None)

    def start(self) -> float:
        """Measure every ready actor's clock offset, then start them all at one instant."""
        offsets: dict[int, float] = {}
        for k, a in enumerate(self.actors):
            ws = self.merger.workers[k]
            if ws.status != READY:
                continue
            node, host, pid = self.where[k]
            m: ClockOffset = measure_offset(functools.partial(_actor_now, self.ray, a))
            same = node == self.here
            # Same node: one kernel clock, the offset is exactly 0 (the measurement is a check).
            offsets[k] = 0.0 if same else m.offset_s
            uncertainty_ms = 0.0 if same else m.uncertainty_s * MS
            ws.extra.update(
                node=node,
                same_node_as_driver=same,
                clock_offset_ms=offsets[k] * MS,
                clock_uncertainty_ms=uncertainty_ms,
                clock_flagged=uncertainty_ms > UNCERTAINTY_FLAG_MS,
                **m.to_dict(),
            )
            if uncertainty_ms > UNCERTAINTY_FLAG_MS:
                log.info(
                    f"warning: worker {k} on {host}: clock offset known only to ±"
                    f"{uncertainty_ms:.2f} ms (> {UNCERTAINTY_FLAG_MS:g} ms): its requests' "
                    "place on the shared schedule is that uncertain"
                )
        t0 = time.perf_counter() + START_MARGIN_S
        for k, a in enumerate(self.actors):
            if k in offsets:
                a.start.remote(t0 - offsets[k])  # the same instant, on the actor's clock
        return t0


def _actor_now(ray, actor) -> float:
    """The actor's clock, read through Ray (one round trip)."""
    return ray.get(actor.now.remote())
