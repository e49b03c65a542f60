"""One worker: sends its share of the schedule open-loop with the ordinary HTTP target
(run_http), from a start instant it is given, and streams each finished request's record out
in batches. The transport is the caller's: a pipe to the parent process (process_main, below),
or a Ray actor's streaming generator (ray_pool.py).

Threads: the caller's thread runs run_http (the asyncio event loop, which must stay free to
send and read on time); a flusher thread moves finished records out every FLUSH_INTERVAL_S, so
pickling and pipe writes never happen inside the loop's request path.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import threading
import traceback
from collections.abc import Callable

from cbbench.analysis.records import RequestRecord
from cbbench.distributed.messages import Done, Failed, Message, Ready, RecordBatch, WorkerTask
from cbbench.errors import UsageError
from cbbench.load.interrupts import STOP_SIGNALS
from cbbench.targets.checks import StreamNotes
from cbbench.targets.checks import log as checks_log
from cbbench.targets.hooks import RunHooks

LOGGER = "cbbench"  # the logger the CLI prints (cli/logs.py)
WARNING_PREFIX = "warning: "  # how run_http says each of its streams' notes

FLUSH_INTERVAL_S = 0.05  # how often finished records go out (and the most a death can lose)
START_POLL_S = 0.05
PARENT_GONE_EXIT = 3  # a worker whose parent vanished stops loading the server at once


class Notices(logging.Handler):
    """The `cbbench` logger's lines in a worker, kept for the parent. Left out: those of
    finish_http_run (targets/checks.py), which the parent says again from the merged records
    (send lag, short outputs, token and prompt counts, the scrape), and the streams' notes,
    which go back counted (Done.notes). Dropped before, with the logger at WARNING: "output
    token counts disagree: 10 of 10 requests carried usage that contradicts their stream"
    said with one process, nothing with two."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self._lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != checks_log.name:
            self._lines.append(record.getMessage())

    def lines(self, notes: StreamNotes | None) -> list[str]:
        said = {WARNING_PREFIX + line for line in notes.warnings()} if notes else set()
        return [line for line in dict.fromkeys(self._lines) if line not in said]


class WorkerCore:
    """The transport-free part of a worker. `emit` is called from any of its threads and must
    be thread-safe; `start` and `stop` may be called from any thread."""

    def __init__(self, task: WorkerTask, emit: Callable[[Message], None]):
        self.task = task
        self.emit = emit
        self._t0: float | None = None
        self._started = threading.Event()
        self._stop = threading.Event()
        self._finished: collections.deque = collections.deque()  # appends: the loop thread
        self._flushed = threading.Event()
        self.done = threading.Event()  # set once Done (or Failed) has been emitted

    def start(self, t0: float) -> None:
        """t0 on this worker's time.perf_counter() clock (may lie in the future)."""
        self._t0 = t0
        self._started.set()

    def stop(self) -> None:
        self._stop.set()

    # -- run_http's hooks (in the event loop) --
    async def _wait_for_start(self) -> float:
        self.emit(Ready(self.task.worker, os.getpid(), socket.gethostname()))
        while not self._started.is_set():  # polled: the loop keeps running meanwhile
            await asyncio.sleep(START_POLL_S)
        assert self._t0 is not None  # set before _started
        return self._t0

    def _on_record(self, pos: int, rec: RequestRecord, method: str) -> None:
        # A session run's positions are already the run's request ids.
        run_pos = pos if self.task.sessions is not None else self.task.positions[pos]
        self._finished.append((run_pos, rec, method))

    # -- the flusher thread --
    def _flush(self) -> None:
        items = []
        q = self._finished
        while q:
            items.append(q.popleft())
        if items:
            self.emit(RecordBatch(self.task.worker, items))

    def _flush_loop(self) -> None:
        while not self._flushed.wait(FLUSH_INTERVAL_S):
            self._flush()

    def run(self) -> None:
        """Blocking: the whole run, ending with Done (or Failed). What the run would say on the
        console is kept, not said (a process, or a Ray actor that inherited the CLI's
        handler, would say it once per worker), and goes back in Done for the parent to say
        once (Notices)."""
        logger = logging.getLogger(LOGGER)
        saved = logger.handlers[:], logger.level, logger.propagate
        notices = Notices()
        logger.handlers, logger.propagate = [notices], False
        logger.setLevel(logging.INFO)
        try:
            self._run(notices)
        finally:
            logger.handlers, logger.propagate = saved[0], saved[2]
            logger.setLevel(saved[1])

    def _run(self, notices: Notices) -> None:
        from cbbench.targets.apis.pooling_request import run_pooling
        from cbbench.targets.http import run_http

        t = self.task
        flusher = threading.Thread(target=self._flush_loop, name="cbbench-flush", daemon=True)
        flusher.start()
        try:
            run = (run_pooling if t.opts.pooling else run_http)(
                t.opts,
                t.wreqs,
                t.arrivals,
                should_stop=self._stop.is_set,
                grace_s=t.grace_s,
                hooks=RunHooks(
                    start_at=self._wait_for_start, on_record=self._on_record, keep_records=False
                ),
                sessions=t.sessions,
                cancel=t.cancel,
            )
        except UsageError as e:
            self._end(flusher)
            self._finish(Failed(t.worker, str(e), usage=True))
            return
        except BaseException as e:  # a bug: report it rather than vanish
            self._end(flusher)
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            self._finish(Failed(t.worker, f"worker {t.worker} crashed: {tb}"))
            return
        self._end(flusher)
        self._finish(
            Done(t.worker, run.duration_s, run.interrupted, run.info, list(run.loop_lag_ms),
                 run.sessions_ended_early, run.notes, notices.lines(run.notes))
        )

    def _finish(self, msg: Message) -> None:
        self.done.set()
        self.emit(msg)

    def _end(self, flusher: threading.Thread) -> None:
        self._flushed.set()
        flusher.join()
        self._flush()  # whatever ended after the last periodic flush


# ---- a worker process (multiprocessing, spawn) -----------------------------------------------
def process_main(task: WorkerTask, ctrl, data) -> None:
    """The worker process's entry: control messages ('start', t0) and ('stop',) arrive on
    `ctrl`; messages go out on `data` from one sender thread (Connection.send pickles)."""
    # Ctrl-C in a terminal reaches the whole process group, and so do a SIGTERM or SIGHUP sent
    # to it (`timeout`, `kill -- -PGID`, a closed terminal); the parent alone decides to stop
    # (and tells the workers), so the workers finish their in-flight requests like one process
    # (load/interrupts.py). SIGTERM killed them: "worker died", its requests worker_lost, exit
    # 3. A worker still never outlives its parent: the control pipe's EOF ends it (below).
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    import queue

    out: queue.SimpleQueue = queue.SimpleQueue()
    core = WorkerCore(task, out.put)

    def send_loop() -> None:
        while (msg := out.get()) is not None:
            try:
                data.send(msg)
            except (BrokenPipeError, OSError):
                os._exit(PARENT_GONE_EXIT)

    def control_loop() -> None:
        while True:
            try:
                msg = ctrl.recv()
            except (EOFError, OSError):
                if core.done.is_set():  # the parent has what it needs and closed its end
                    return
                os._exit(PARENT_GONE_EXIT)  # the parent is gone: nobody will read the results
            if msg[0] == "start":
                core.start(msg[1])
            elif msg[0] == "stop":
                core.stop()

    sender = threading.Thread(target=send_loop, name="cbbench-send", daemon=True)
    sender.start()
    threading.Thread(target=control_loop, name="cbbench-ctrl", daemon=True).start()
    core.run()
    out.put(None)
    sender.join()
    data.close()  # what is in the pipe stays readable after this process exits
