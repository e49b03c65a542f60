"""The bridge between the asyncio server and the engine.

The engine is not thread-safe and its ``step()`` blocks (a real forward pass, or the simulator
sleeping out its predicted time on a wall clock), so it lives in one dedicated thread that
builds it, owns it and drives it with the engine's one loop (engine/core/feed.py run_feed),
the inbox being its feed:

    drain the inbox (adds, aborts) -> step() if there is work, else wait on the inbox
    -> hand every new token to its request's asyncio.Queue

Deliveries cross into the event loop with one ``call_soon_threadsafe`` per step for the whole
batch (not one per token), which keeps a thousand concurrent streams cheap. Nothing else touches
the engine: other threads read ``snapshot()``, a frozen copy republished after every step.

The bridge only uses the engine's public surface (add_request, abort_request, step,
has_unfinished, clock, scheduler and block_manager sizes), so the torch engine serves the same
way as the simulator once ``build_engine`` returns one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from cbbench.engine.core.engine import StepFailed
from cbbench.engine.core.feed import run_feed
from cbbench.engine.core.request import Request, RequestStatus, SamplingParams
from cbbench.engine.model_config import eos_ids_of
from cbbench.errors import UsageError
from cbbench.server.engine_events import (
    Admitted,
    EngineObserver,
    EngineSnapshot,
    Failed,
    FinishedStats,
    StepStats,
    StreamEvent,
    TokenEvent,
)

if TYPE_CHECKING:
    from cbbench.engine.core.engine import Engine

log = logging.getLogger("cbbench.server")

# How long the idle engine thread sleeps between looks at the stop flag; new requests wake it
# at once, so this only bounds how long shutdown can take.
IDLE_WAIT_S = 0.5
STOP_JOIN_TIMEOUT_S = 10.0
# The engine records every step; a server keeps only the most recent records so its memory
# stays flat. Nothing in the server reads them.
KEEP_RECORDS = 4096
STEP_FAILED = 500  # the status of a request whose batch the engine failed on


class RequestStream:
    """One request's events, read by the coroutine that serves it (event-loop side).
    ``submitted_s``: when the request was handed to the engine (perf_counter seconds): its
    arrival, as the engine and the latency metrics count it."""

    def __init__(self, bridge: AsyncEngine, req: Request, submitted_s: float) -> None:
        self.req = req
        self.submitted_s = submitted_s
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.finished = False
        self._bridge = bridge

    async def next(self) -> StreamEvent:
        ev = await self.queue.get()
        if isinstance(ev, Failed) or (
            (isinstance(ev, Admitted) and ev.error is not None)
            or (isinstance(ev, TokenEvent) and ev.finish_reason is not None)
        ):
            self.finished = True
        return ev

    def close(self) -> None:
        """Abort the request unless it already ended (safe to call more than once)."""
        if not self.finished:
            self.finished = True
            self._bridge.abort(self.req)


class _Live:
    """Engine-side state of a stream: where to deliver, how many tokens were sent, and when
    the scheduler took it in (engine clock: vLLM's QUEUED event, where its queue time starts)."""

    __slots__ = ("queue", "sent", "queued")

    def __init__(self, queue: asyncio.Queue, queued: float) -> None:
        self.queue = queue
        self.sent = 0
        self.queued = queued


Delivery = list[tuple[asyncio.Queue, StreamEvent]]


RESET = "reset_prefix_cache"  # the inbox's op for POST /reset_prefix_cache


class AsyncEngine:
    def __init__(
        self,
        build: Callable[[], tuple[Engine, dict]],
        observer: EngineObserver | None = None,
    ) -> None:
        """``build`` runs in the engine thread and returns (engine, info), as build_engine."""
        self._build = build
        self._observer = observer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._inbox: deque[tuple[str, Request, asyncio.Queue | None]] = deque()
        self._lock = threading.Lock()  # guards _inbox and _closed
        self._closed = False
        self._wake = threading.Event()
        self._stopping = False
        self._ready = threading.Event()
        self._ids = itertools.count()
        self._offset = 0.0  # perf_counter() - engine clock
        self._snapshot = EngineSnapshot(ready=False)
        self._num_steps = 0
        self.info: dict | None = None
        self.eos_token_ids: tuple[int, ...] = ()

    # ---- lifecycle (event-loop side) ----------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="cbbench-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_JOIN_TIMEOUT_S)

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self._snapshot.error is None

    def wait_ready(self, timeout: float) -> bool:
        """Block until the engine is built (True) or failed / the timeout passed (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready.wait(min(0.05, timeout)):
                return self.ready
            if self.error is not None:
                return False
        return False

    @property
    def error(self) -> str | None:
        return self._snapshot.error

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    # ---- requests (event-loop side) -----------------------------------------------------------
    def submit(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams,
               encoder_flops: float = 0.0, pooling: bool = False,
               reply_ids: list[int] | None = None) -> RequestStream:
        """``encoder_flops``: a multimodal request's vision-encoder work (server/images.py);
        ``pooling``: keep its last prompt token's hidden state (torch: server/apis/pooling.py);
        ``reply_ids``: the simulated engine's scripted output ids (text.py
        placeholder_reply_ids), its tokens' ids as they come."""
        # The request arrives now, on the engine's clock: a request handed over while the engine
        # is mid-iteration waits for the iteration's end, and that wait is the engine's (it is
        # in the in-process target's TTFT, and in vLLM's, whose arrival is stamped before the
        # hand-over to its engine core), not the HTTP layer's.
        submitted = time.perf_counter()
        req = Request(
            next(self._ids),
            len(prompt_ids),
            max_tokens,
            arrival_time=submitted - self._offset,
            prompt_token_ids=prompt_ids,
            sampling=sampling,
            eos_token_ids=self.eos_token_ids,
            encoder_flops=encoder_flops,
        )
        req.pooling = pooling
        if reply_ids is not None:
            req.output_token_ids = reply_ids
        stream = RequestStream(self, req, submitted)
        with self._lock:
            closed = self._closed
            if not closed:
                self._inbox.append(("add", req, stream.queue))
        if closed:
            stream.queue.put_nowait(Failed(self.error or "the engine is shut down"))
        else:
            self._wake.set()
        return stream

    def abort(self, req: Request) -> None:
        with self._lock:
            if self._closed:
                return
            self._inbox.append(("abort", req, None))
        self._wake.set()

    async def reset_prefix_cache(self) -> bool | str:
        """POST /reset_prefix_cache: the engine drops its cached prefixes between two steps.
        True: done; False: a request still holds KV blocks (nothing dropped); a string: the
        engine is down (why)."""
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            closed = self._closed
            if not closed:
                self._inbox.append((RESET, None, queue))  # type: ignore[arg-type]
        if closed:
            return self.error or "the engine is shut down"
        self._wake.set()
        answer = await queue.get()
        return answer if isinstance(answer, bool) else (self.error or "the engine failed")

    # ---- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        live: dict[Request, _Live] = {}
        try:
            engine, info = self._build()
            if not getattr(engine.clock, "realtime", False):
                raise RuntimeError("serving needs an engine on a real-time clock")
            engine.keep_recent_records(KEEP_RECORDS)
            self._offset = time.perf_counter() - engine.clock.now()
            self.info = info
            self.eos_token_ids = eos_ids_of(info)
            if self._observer is not None:
                self._observer.on_ready(info)
            self._publish_snapshot(engine)
            self._ready.set()
            self._serve(engine, live)
            error = "the server is shutting down"
        except UsageError as e:  # bad options (unknown GPU, model that does not fit): one line
            error = str(e)
            self._snapshot = EngineSnapshot(ready=False, error=error)
        except Exception as e:
            log.exception("the engine failed")
            error = f"the engine failed: {e}"
            self._snapshot = EngineSnapshot(ready=False, error=error)
        finally:
            with self._lock:
                self._closed = True
                # adds and resets carry the queue that waits for their answer (aborts: None)
                pending = [q for op, _, q in self._inbox if op in ("add", RESET) and q is not None]
                self._inbox.clear()
            batch: Delivery = [(q, Failed(error)) for q in pending]
            batch += [(s.queue, Failed(error)) for s in live.values()]
            self._deliver_threadsafe(batch)

    def _serve(self, engine, live: dict[Request, _Live]) -> None:
        feed = _InboxFeed(self, engine, live)
        try:
            run_feed(engine, feed, should_stop=lambda: self._stopping,
                     on_step_failed=feed.on_step_failed)
        except Exception:
            feed.hand_over()  # this drain's verdicts, rejections included
            raise

    def _take_inbox(self) -> list[tuple[str, Request, asyncio.Queue | None]]:
        self._wake.clear()  # before draining: a later submit sets it again
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        return items

    def _publish_snapshot(self, engine) -> None:
        sched = engine.scheduler
        bm = engine.block_manager
        self._snapshot = EngineSnapshot(
            ready=True,
            running=len(sched.running),
            waiting=len(sched.waiting),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            num_steps=self._num_steps,
        )

    def _deliver_threadsafe(self, batch: Delivery) -> None:
        if not batch or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class _InboxFeed:
    """The server's inbox as the engine loop's feed (an OpenFeed: never done). Each iteration
    ends in one hand-over to the event loop (``hand_over``): a step's tokens with the
    admissions of the drain before it, because each hand-over costs this thread a GIL round
    trip with the busy event loop."""

    def __init__(self, bridge: AsyncEngine, engine, live: dict[Request, _Live]) -> None:
        self.bridge = bridge
        self.engine = engine
        self.live = live
        self.batch: Delivery = []

    def next_time(self) -> float | None:
        return None  # requests arrive when clients send them, never on a schedule

    def fire(self, engine, now: float) -> None:
        """Drain the inbox: adds (admitted, rejected or failed) and aborts."""
        obs = self.bridge._observer
        for op, req, queue in self.bridge._take_inbox():
            if op == "add":
                self._add(engine, req, queue)
            elif op == RESET:  # between steps: no request is mid-iteration
                self.batch.append((queue, engine.reset_prefix_cache()))  # type: ignore[arg-type]
            elif self.live.pop(req, None) is not None and not req.status.is_done:
                engine.abort_request(req)  # frees its KV blocks
                if obs is not None:
                    obs.on_aborted(req)
        # The engine lists every request it rejected (a run's result reads them); a server
        # has answered them already, and keeping them, prompts included, leaked memory.
        engine.rejected.clear()

    def _add(self, engine, req: Request, queue) -> None:
        obs = self.bridge._observer
        admitted = time.perf_counter()
        reason = engine.add_request(req)
        if req.status == RequestStatus.FAILED:  # not a rejection: the engine's error
            log.error("the engine could not take a request: %s", reason)
            self.batch.append((queue, Failed(reason, STEP_FAILED)))
            if obs is not None:
                obs.on_failed(req)
            return
        self.batch.append((queue, Admitted(reason, admitted)))
        if reason is None:
            self.live[req] = _Live(queue, admitted - self.bridge._offset)
            if obs is not None:
                obs.on_admitted(req)
        elif obs is not None:
            obs.on_rejected(req)

    def on_step(self, step) -> None:
        bridge = self.bridge
        obs = bridge._observer
        stats = StepStats() if obs is not None else None
        self._collect_tokens(step, stats)
        bridge._num_steps += 1
        self.hand_over()
        if obs is not None and stats is not None:
            obs.on_step(step, stats)

    def on_step_failed(self, e: StepFailed) -> None:
        """Those requests failed; the engine serves on."""
        log.error("an engine step failed; its %d request(s) failed",
                  len(e.requests), exc_info=e.cause)
        obs = self.bridge._observer
        for req in e.requests:
            state = self.live.pop(req, None)
            if state is not None:
                if obs is not None:
                    obs.on_failed(req)
                # the engine set every failed request's finish_reason to why (engine.py)
                assert req.finish_reason is not None
                self.batch.append((state.queue, Failed(req.finish_reason, STEP_FAILED)))
        self.hand_over()

    def idle(self) -> None:
        """Nothing to step: hand over this drain's verdicts, then wait for the inbox (the
        timeout only bounds how long a stop can take to be seen)."""
        self.hand_over()
        self.bridge._wake.wait(IDLE_WAIT_S)

    def hand_over(self) -> None:
        """The iteration's end: republish the snapshot, deliver the batch in one hand-over."""
        self.bridge._publish_snapshot(self.engine)
        batch, self.batch = self.batch, []
        self.bridge._deliver_threadsafe(batch)

    def _collect_tokens(self, out, stats: StepStats | None) -> None:
        offset = self.bridge._offset
        live, batch = self.live, self.batch
        for req in out.scheduled.scheduled_reqs:
            state = live.get(req)
            if state is None:
                continue
            n = req.num_output_tokens
            sent = state.sent
            if n == sent:
                continue  # a prefill chunk without a token yet
            ids = req.output_token_ids
            times = req.token_times
            finished = req.status == RequestStatus.FINISHED
            # One event for all the tokens this step gave the request (several under
            # speculative decoding): the server writes them as one stream event.
            tokens = tuple(ids[i] if i < len(ids) else None for i in range(sent, n))
            reason = req.finish_reason if finished else None
            batch.append((state.queue, TokenEvent(tokens, times[n - 1] + offset, reason)))
            state.sent = n
            if stats is not None:
                _step_stats(stats, req, sent, finished, state.queued)
            if finished:
                del live[req]


def _step_stats(stats: StepStats, req: Request, sent: int, finished: bool,
                queued: float) -> None:
    """Add one request's new tokens of this step to ``stats`` (engine-clock times; ``queued``:
    when the scheduler took the request in)."""
    times = req.token_times
    n = req.num_output_tokens
    stats.new_tokens += n - sent
    if sent == 0:
        stats.ttfts_s.append(times[0] - req.arrival_time)
        stats.prompt_tokens += req.num_prompt_tokens
    else:
        # One gap per engine output, however many tokens it carries (vLLM's stats.py
        # update_from_output): accepted drafts are not gaps of 0 s.
        stats.itls_s.append(times[n - 1] - times[sent - 1])
    if not finished:
        return
    first, last = times[0], times[-1]
    scheduled = req.first_scheduled_time if req.first_scheduled_time is not None else first
    stats.finished.append(
        FinishedStats(
            finish_reason=req.finish_reason or "length",
            e2e_s=last - req.arrival_time,
            # vLLM's queue time starts at its scheduler's QUEUED event, not at the arrival: the
            # wait for the engine's step in flight when the request came is not queueing.
            queue_s=scheduled - queued,
            prefill_s=first - scheduled,
            decode_s=last - first,
            inference_s=last - scheduled,
            mean_tpot_s=(last - first) / (n - 1) if n > 1 else 0.0,
            prompt_tokens=req.num_prompt_tokens,
            output_tokens=n,
            max_tokens=req.max_tokens,
        )
    )


def _deliver(batch: Delivery) -> None:
    for queue, ev in batch:
        queue.put_nowait(ev)
