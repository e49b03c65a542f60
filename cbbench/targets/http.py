"""The HTTP target: replay a workload against an OpenAI-compatible endpoint (vLLM, SGLang, TGI,
llama.cpp, `cbbench serve`) with an open-loop arrival schedule, and record per-request token
timestamps in the same RequestRecord form as the in-process engine.

Open loop without coordinated omission: each request is sent at its intended time (an
absolute deadline on the run clock, so timer errors never accumulate) by its own task, which
the dispatcher makes DISPATCH_LEAD_S ahead, whatever the server is doing; TTFT and E2EL count
from that intended time (metrics.py), and the send lag (actual send - intended) says whether
the client kept up. --max-concurrency turns it into a
capped loop: a request waits for a slot, and `slot_s` records when it got one.

Each request is one streamed call of the run's --api (`/v1/completions`, `/v1/chat/completions`,
`/v1/responses`, `/v1/messages`: api_specs.py; request.py sends it, sse.py or the API's own
module parses its stream) over the streams' own keep-alive pool, parsed where each network read
arrives (stream_pool.py), on uvloop where installed (client_loop.py); aiohttp (transport.py)
serves the small GETs. results/loadgen_rust_parity.md has its cost beside vLLM's Rust client. Failures are recorded on
their request, never raised: error_type is one of ERROR_TYPES.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.token_counts import DETECT_SAMPLE_REQUESTS
from cbbench.errors import UsageError
from cbbench.fd_limit import raise_open_file_limit
from cbbench.load.cancel import CancelPlan
from cbbench.load.chat_template import chat_prompt_tokens
from cbbench.load.images import EncodedContent, attach_images, image_request_body
from cbbench.load.interrupts import DEFAULT_GRACE_S
from cbbench.load.output_kinds import request_fields
from cbbench.load.prompts import build_prompts, load_tokenizer
from cbbench.load.session_plan import SessionPlan
from cbbench.load.workload import WorkloadRequest
from cbbench.targets.apis.api_specs import SPECS
from cbbench.targets.apis.server_tokenize import size_with_server
from cbbench.targets.balance import Balancer, endpoint_contexts, lora_models, tag_records
from cbbench.targets.checks import (
    TOKEN_COUNT_METHODS,
    StreamNotes,
    count_request,
    error_rate,
    finish_http_run,
    send_lag_check,
)
from cbbench.targets.client_health import ClientMonitor, sleep_until
from cbbench.targets.client_loop import loop_name, run_client
from cbbench.targets.gc_freeze import (
    freeze_heap,
    restore_collections,
    space_collections,
    thaw_heap,
)
from cbbench.targets.hooks import RunHooks
from cbbench.targets.http_sessions import SessionDispatch
from cbbench.targets.options import API_PATHS, EndpointOptions, redact_url
from cbbench.targets.read_buffers import keep_reads_on_heap
from cbbench.targets.request import RequestContext, request_body, send_request
from cbbench.targets.scrape import MetricsScraper
from cbbench.targets.sse import SseStream
from cbbench.targets.stream_pool import StreamPool
from cbbench.targets.transport import ERROR_TYPES, classify, get_body, new_session

if TYPE_CHECKING:
    from yarl import URL

log = logging.getLogger(__name__)

__all__ = [
    "ERROR_TYPES", "TOKEN_COUNT_METHODS", "EndpointOptions", "HttpRun", "error_rate",
    "finish_http_run", "run_http", "send_lag_check",
]

STOP_POLL_S = 0.1
# How far ahead of a request's time the dispatcher makes its task (which then waits for it).
DISPATCH_LEAD_S = 0.005
PROGRESS_INTERVAL_S = 0.1
MODELS_TIMEOUT_S = 30.0
MODELS_MAX_BYTES = 1 << 20
MODELS_SHOWN = 10  # models named in the "choose one" error
MODEL_ID_SHOWN_CHARS = 40  # of a listed id that is not a name, in its error
ERROR_CHARS = 300  # of a request's error message raised while counting it


@dataclass
class HttpRun:
    records: list[RequestRecord]  # the requests that were sent, in schedule order
    duration_s: float
    interrupted: bool
    info: dict
    not_sent: int = 0
    loop_lag_ms: Sequence[float] = field(default_factory=list)  # the heartbeat's samples
    sessions_ended_early: int = 0  # multi-turn: sessions cut short by a failed turn
    notes: StreamNotes | None = None  # what the streams said that counting set aside (warned)


class _Runner:
    """One run: the dispatcher sends each request at its intended time (after a free slot under
    --max-concurrency), a watcher stops the run on request, and the scraper samples /metrics.
    With ``sessions`` the dispatch is theirs (http_sessions.py): each session sends its own
    turns through this runner's slots, sends and records. The embeddings and rerank APIs are
    a subclass (pooling_request.py): its own request, send and count, chosen once per run."""

    _send = staticmethod(send_request)  # one request: send, read, record

    def __init__(
        self,
        opts: EndpointOptions,
        wreqs: Sequence[WorkloadRequest],
        arrivals: Sequence[float] | np.ndarray,
        prompts: list,
        tokenizer,
        should_stop: Callable[[], bool] | None,
        on_progress: Callable[[int, int], None] | None,
        grace_s: float = DEFAULT_GRACE_S,
        hooks: RunHooks | None = None,
        cancel: CancelPlan | None = None,
        sessions: SessionDispatch | None = None,
    ):
        self.sessions = sessions
        self.grace_s = grace_s
        self.cancel = cancel
        self.hooks = hooks or RunHooks()
        self.methods = dict.fromkeys(TOKEN_COUNT_METHODS, 0)
        self.sampled = 0  # requests whose events were tokenized one by one
        self.notes = StreamNotes()  # what the streams said that counting set aside
        # Chat: each prompt's tokens inside the tokenizer's chat template (load/chat_template).
        self.chat_prompt_tokens: list[int | None] | None = None
        # Requests with images (load/images.py): (images, image bytes) per request, else None.
        self.image_info: list[tuple[int, int | None] | None] | None = None
        self.monitor: ClientMonitor | None = None
        self.opts = opts
        self.wreqs = wreqs
        self.arrivals = [float(a) for a in arrivals]
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.should_stop = should_stop
        self.on_progress = on_progress
        self.base = opts.endpoints()[0]  # /v1/models, /tokenize, /metrics: the first URL
        self.spec = SPECS[opts.api]
        self.chat = self.spec.chat
        n = len(wreqs)
        self.records: list[RequestRecord | None] = [None] * n
        self.streams: list[SseStream | None] = [None] * n
        self.pending: set[asyncio.Task] = set()
        self.sem: asyncio.Semaphore | None = None
        self.t0 = 0.0
        self.finished = 0
        self.last_progress = -math.inf
        self.in_flight = 0
        self.max_in_flight = 0
        self.stopped = False
        # Set with `stopped`: what waits for a moment (a session's think time) wakes on it.
        self.stop_event: asyncio.Event | None = None
        # Set when the run starts (run()), before any request is made: typed as always there.
        self.ctx: RequestContext = None  # type: ignore[assignment]
        # Several --endpoint URLs: which one each send goes to (targets/balance.py).
        self.balancer: Balancer | None = None
        self.models: list[str | None] | None = None  # --lora-modules: each request's model
        # No --tokenizer: sizes the synthetic prompts with the server's /tokenize, before t0.
        self.size_prompts: Callable[..., Awaitable[str]] | None = None
        # --workload random-mm / JSONL images: turns prompts into content parts (load/images.py)
        self.attach_images: Callable[[], list | None] | None = None
        # The streams' connections (stream_pool.py), by origin; their headers and size limit.
        self.pools: dict[tuple, StreamPool] = {}
        self.pool_settings: tuple[dict[str, str], int | None] = ({}, None)

    def _one(self, pos: int, at: float) -> Coroutine[None, None, None]:
        """Request `pos` from its intended start ``at`` on perf_counter (wait for it, then a
        slot, send, record): the coroutine the dispatcher runs as the request's task. Made here, not awaited here: every
        coroutine between the task and the socket is resumed on each network read, so the hot
        path is task -> _exchange -> send_request -> exchange and no deeper."""
        w = self.wreqs[pos]
        rec = RequestRecord(
            id=w.id,
            prompt_tokens=w.prompt_len,
            output_tokens=0,
            intended_start_s=self.arrivals[pos],
            priority=w.priority,
            max_tokens=w.output_len,
        )
        if self.chat_prompt_tokens is not None and (n := self.chat_prompt_tokens[pos]) is not None:
            rec.prompt_token_counts = {"chat_template": n}
        if self.image_info is not None and (im := self.image_info[pos]) is not None:
            rec.images, rec.image_bytes = im
        st = self.spec.stream(rec.token_times_s, self.tokenizer is not None)
        extra = request_fields(w.reasoning_len, w.tools, w.tool_choice, self.chat)
        if self.models is not None and self.models[pos] is not None:  # a LoRA adapter
            rec.model = self.models[pos]
            extra = {**(extra or {}), "model": rec.model}
        prompt = self.prompts[pos]
        make = (image_request_body if isinstance(prompt, EncodedContent)
                else self.spec.single_body or request_body)
        return self._exchange(pos, rec, st, partial(make, self.ctx, prompt, w.output_len, extra),
                              at)

    async def _exchange(self, pos: int, rec: RequestRecord, st: SseStream,
                        make_body: Callable[[], bytes], at: float | None = None) -> None:
        """Wait until ``at`` (perf_counter) where given, then for a slot (--max-concurrency),
        send, record: one request's life, whether a single request or a session's turn. A run
        stopped before the send (before ``at``, or while it waited for a slot) sends nothing:
        only what is in flight finishes within the grace period."""
        has_slot = False
        try:
            if at is not None:
                await sleep_until(at)
            if self.stopped:  # a session's turn after the stop, too: dispatch has stopped
                return
            if self.sem is not None:
                waits = self.sem.locked()
                await self.sem.acquire()
                has_slot = True
                if self.stopped:  # it waited for a slot through the stop: not sent, and its
                    return  # slot goes at once to the next waiter, which returns likewise
                # A slot free at once is no wait: the client was ready at the intended start,
                # and any lateness before it is send lag, as without a cap (it was reported as
                # slot wait under a cap that never bound).
                rec.slot_s = rec.first_scheduled_s = (time.perf_counter() - self.t0 if waits
                                                      else rec.intended_start_s)
            body = make_body()
            rec.request_bytes = len(body)
            self.records[pos], self.streams[pos] = rec, st
            ctx, picked = self.ctx, None
            if self.balancer is not None:  # several endpoints: chosen at the send
                picked = self.balancer.acquire()
                ctx, rec.endpoint = self.balancer.contexts[picked], self.balancer.urls[picked]
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                cancel_after = (
                    self.cancel.cancel_after_s(rec.id) if self.cancel is not None else None
                )
                if cancel_after is None:
                    await self._send(ctx, rec, body, st)
                else:
                    await self._send_cancelled(ctx, rec, body, st, cancel_after)
            finally:
                self.in_flight -= 1
                if picked is not None:
                    self.balancer.release(picked)  # type: ignore[union-attr]  # picked: it is set
        except asyncio.CancelledError:  # the run was stopped; unsent requests stay unrecorded
            if rec.send_s is not None and rec.error is None:
                rec.error_type, rec.error = (
                    "interrupted",
                    "run interrupted before the request finished",
                )
        finally:
            if has_slot:
                assert self.sem is not None  # has_slot: it was acquired
                self.sem.release()
            if rec.send_s is not None:
                self._ended(pos, rec, st)

    async def _send_cancelled(self, ctx: RequestContext, rec: RequestRecord, body: bytes,
                              st: SseStream, delay: float) -> None:
        """send_request until `delay` after the request is on the wire, for a request
        --cancel-rate picked: then the stream is closed (the server sees the client go away).
        The delay starts once the body is written, as AIPerf's: from the task's start, a
        connection's set-up ate into it, and `--cancel-after 0` closed every stream before its
        request was written (the server saw nothing, the run reported them all cancelled)."""
        st.written = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._send(ctx, rec, body, st))
        try:
            await asyncio.wait({task, st.written}, return_when=asyncio.FIRST_COMPLETED)
            done, _ = await asyncio.wait({task}, timeout=delay)
            if not done:  # its answer may have ended in the deadline's own loop pass: the
                await asyncio.sleep(0)  # request's wake-up is queued; it completed, let it end
        except asyncio.CancelledError:  # the run was stopped: stop the request too
            task.cancel()
            raise
        if task.done():
            task.result()
            return
        task.cancel()  # leaving the response's context closes its connection
        try:
            await task
        except asyncio.CancelledError:
            pass
        rec.cancelled = True

    def _ended(self, pos: int, rec: RequestRecord, st: SseStream) -> None:
        """A sent request ended: its record is final now (a worker streams it out)."""
        try:
            method = count_request(rec, st, self.tokenizer,
                                   self.sampled < DETECT_SAMPLE_REQUESTS, self.notes)
        except Exception as e:  # noqa: BLE001 - a stream no rule foresaw: this request fails
            # Raised here it was a "Task exception was never retrieved" and a request recorded
            # as completed with 0 output tokens.
            method = rec.output_tokens_method or "events"
            if rec.error is None:
                rec.error_type = "client_error"
                rec.error = f"counting its output failed: {type(e).__name__}: {e}"[:ERROR_CHARS]
        self.sampled += "one_token_events" in (rec.output_token_counts or ())
        if rec.error is None:
            self.methods[method] += 1
        # Its counts are on the record now. Kept, the parser's lists would outlive the request
        # to the run's end: more objects for the collector (a full collection walks them all).
        self.streams[pos] = None
        if self.hooks.on_record is not None:
            self.hooks.on_record(pos, rec, method)
            if not self.hooks.keep_records:  # streamed out: hold nothing for the end
                self.records[pos] = None
        self.finished += 1
        self._progress()

    def _progress(self) -> None:
        # Throttled: a progress bar needs a few updates a second, not one per request.
        if self.on_progress is None:
            return
        now = time.perf_counter()
        if now - self.last_progress >= PROGRESS_INTERVAL_S or self.finished == len(self.wreqs):
            self.last_progress = now
            self.on_progress(self.finished, len(self.wreqs))

    async def _dispatch(self) -> None:
        if self.sessions is not None:
            await self.sessions.dispatch(self)
            return
        loop = asyncio.get_running_loop()
        order = sorted(range(len(self.wreqs)), key=self.arrivals.__getitem__)  # stable
        arrivals, t0, n, i = self.arrivals, self.t0, len(order), 0
        while i < n:
            # Absolute deadlines on the run clock: a late wake-up does not shift later sends.
            await sleep_until(t0 + arrivals[order[i]] - DISPATCH_LEAD_S)
            # Each request due within the lead gets its task now, which waits for its own
            # time and sends at once: a task made at the request's time would start only after
            # the loop's next pass over the network reads.
            horizon = time.perf_counter() - t0 + DISPATCH_LEAD_S
            while i < n and arrivals[order[i]] <= horizon:
                pos = order[i]
                i += 1
                task = loop.create_task(self._one(pos, t0 + arrivals[pos]))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)

    async def _watch_stop(self, dispatcher: asyncio.Task, should_stop: Callable[[], bool]) -> None:
        while not should_stop():
            await asyncio.sleep(STOP_POLL_S)
        self.stopped = True
        if self.stop_event is not None:
            self.stop_event.set()
        dispatcher.cancel()
        # In-flight requests may finish within the grace period; the rest are cancelled.
        if self.pending and self.grace_s > 0:
            await asyncio.wait(set(self.pending), timeout=self.grace_s)
        for task in list(self.pending):
            task.cancel()

    async def wait_until(self, deadline: float) -> None:
        """sleep_until ``deadline`` (perf_counter), cut short by the run's stop: a session in
        its think time sends nothing more, so it does not hold the stop's grace period."""
        stop = self.stop_event
        if stop is None:
            await sleep_until(deadline)
            return
        if self.stopped:
            return
        waits = [asyncio.ensure_future(sleep_until(deadline)), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def run(self) -> tuple[float, dict]:
        o = self.opts
        self.stop_event = asyncio.Event()  # made in the run's own event loop
        wanted = o.max_concurrency or max(1, len(self.wreqs))
        pool = raise_open_file_limit(wanted)
        headers = {"Content-Type": "application/json", **self.spec.headers(o.headers), **o.headers}
        # Capped by the open-files limit: the excess waits for a connection inside its TTFT.
        info: dict = {"connection_pool_size": pool, "connection_pool_capped": pool < wanted}
        if o.max_concurrency:
            self.sem = asyncio.Semaphore(o.max_concurrency)
        from yarl import URL  # aiohttp's URL type: parsed once here, not on every request

        url = URL(self.base + API_PATHS[o.api])
        session = new_session(headers, max_connections=pool)
        self.pool_settings = (headers, pool)
        frozen = False
        thresholds: tuple[int, ...] | None = None
        try:
            model = o.served_model or await self._discover_model(session, info)
            info["served_model"] = model
            if self.size_prompts is not None:  # before the clock: no load is measured yet
                info["prompt_sizing"] = await self.size_prompts(session, self.base, model)
            if self.attach_images is not None:  # after the sizing: it resizes the text first
                self.image_info = self.attach_images()
            payload = self._payload(model)
            scraper = None
            if o.scrape_metrics:
                scraper = MetricsScraper(self.base, o.headers, o.scrape_metrics_filter)
                await scraper.baseline()  # before the clock starts
            frozen = freeze_heap()  # the heap so far: out of the run's collections
            thresholds = space_collections()  # and those collections fewer (gc_freeze.py)
            keep_reads_on_heap()  # no mmap per network read, whatever the process did before
            start_at = self.hooks.start_at
            self.t0 = await start_at() if start_at is not None else time.perf_counter()
            if self.hooks.on_run is not None:
                self.hooks.on_run(self)
            self.monitor = ClientMonitor(self.t0)
            heartbeat = asyncio.create_task(self.monitor.run())
            self.ctx = RequestContext(
                session=session,
                url=url,
                t0=self.t0,
                timeout_s=o.request_timeout_s,
                payload=payload,
                chat=self.chat,
                pool=self._pool_for(url),
            )
            urls = o.endpoints()
            if len(urls) > 1:
                self.balancer = Balancer(self._endpoint_contexts(urls),
                                         [redact_url(u) for u in urls], o.balance)
            scrape_task = asyncio.create_task(scraper.run(self.t0)) if scraper else None
            dispatcher = asyncio.create_task(self._dispatch())
            watcher = (
                asyncio.create_task(self._watch_stop(dispatcher, self.should_stop))
                if self.should_stop is not None
                else None
            )
            try:
                await dispatcher
            except asyncio.CancelledError:
                if not self.stopped:  # the stop watcher cancels it; anything else propagates
                    raise
            while self.pending:
                await asyncio.wait(set(self.pending))
            duration = time.perf_counter() - self.t0
            self.monitor.stop()
            heartbeat.cancel()
            info.update(self.monitor.result(duration))
            if watcher is not None:
                watcher.cancel()
            if scraper is not None and scrape_task is not None:
                scraper.stop()
                await scrape_task
                info.update(scraper.result())
        finally:
            if thresholds is not None:
                restore_collections(thresholds)
            thaw_heap(frozen)
            for stream_pool in self.pools.values():
                stream_pool.close()
            await session.close()
        info["max_in_flight"] = self.max_in_flight
        if self.balancer is not None:
            info["sent_by_endpoint"] = dict(zip(self.balancer.urls, self.balancer.sent))
        return duration, info

    def _pool_for(self, url: URL) -> StreamPool:
        """The streams' keep-alive pool for the URL's origin (one per endpoint host)."""
        key = (url.scheme, url.host, url.port)
        if key not in self.pools:
            headers, limit = self.pool_settings
            self.pools[key] = StreamPool(url, headers, limit)
        return self.pools[key]

    def _endpoint_contexts(self, urls: list[str]) -> list[RequestContext]:
        """Several --endpoint URLs: a request context each, with its origin's pool."""
        from yarl import URL

        contexts = endpoint_contexts(self.ctx, [URL(u + API_PATHS[self.opts.api]) for u in urls])
        for c in contexts:
            c.pool = self._pool_for(c.url)
        return contexts

    def _payload(self, model: str) -> dict:
        """The fields every request body of the run carries."""
        payload = self.spec.payload(model)  # the API's own (targets/apis/api_specs.py)
        if self.opts.ignore_eos_field:
            payload["ignore_eos"] = True
        return payload

    async def _discover_model(self, session, info: dict) -> str:
        where = redact_url(self.base + "/v1/models")
        try:
            status, body = await get_body(
                session, self.base + "/v1/models", MODELS_MAX_BYTES, MODELS_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            raise UsageError(f"GET {where} did not answer within {MODELS_TIMEOUT_S:g} s") from None
        except Exception as e:
            raise UsageError(
                f"cannot list the served models at {where} ({classify(e)[1]}): is the server "
                "up? --served-model NAME skips this look-up"
            ) from None
        if status != 200:
            raise UsageError(f"GET {where} answered HTTP {status}; give --served-model NAME")
        try:
            cards = json.loads(body)["data"]
            ids = [m["id"] for m in cards]
            # vLLM lists its LoRA adapters beside the base model, each with a "parent".
            bases = [m["id"] for m in cards if not m.get("parent")]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            ids = bases = []  # RecursionError: JSON nested deeper than the decoder goes
        if not ids:
            raise UsageError(f"GET {where} listed no models; give --served-model NAME")
        # Every request carries the id and the summary prints it: an int id was a TypeError
        # here, a dict one went out in the requests and broke the analysis, a lone surrogate
        # broke printing the summary. A server listing such an id is not guessed at.
        bad = [i for i in ids if not _model_name(i)]
        if bad:
            shown = ascii(bad[0])
            if len(shown) > MODEL_ID_SHOWN_CHARS:
                shown = shown[:MODEL_ID_SHOWN_CHARS] + "..."
            raise UsageError(f"GET {where} listed a model id that is not a name ({shown}); "
                             "give --served-model NAME")
        info["models_listed"] = ids[:10]
        if len(ids) == 1 or len(bases) == 1:
            return ids[0] if len(ids) == 1 else bases[0]
        shown = ", ".join(ids[:MODELS_SHOWN]) + (", ..." if len(ids) > MODELS_SHOWN else "")
        raise UsageError(f"{where} serves {len(ids)} models ({shown}): choose one with "
                         "--served-model NAME")


def _model_name(v: object) -> bool:
    """A listed model id a request can name: a non-empty text that UTF-8 can write (JSON's
    "\\ud800" decodes to a lone surrogate, which it cannot)."""
    if type(v) is not str or not v:
        return False
    try:
        v.encode()
    except UnicodeEncodeError:
        return False
    return True


def run_http(
    opts: EndpointOptions,
    wreqs: list[WorkloadRequest],
    arrivals: np.ndarray | Sequence[float],
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    keep_token_ids: bool = False,  # unused: streamed text carries no token ids
    grace_s: float = DEFAULT_GRACE_S,
    hooks: RunHooks | None = None,
    sessions: SessionPlan | None = None,
    cancel: CancelPlan | None = None,
) -> HttpRun:
    """Replay `wreqs` at `arrivals` (seconds from the run start) against the endpoint, or,
    with `sessions`, the plan's multi-turn sessions (http_sessions.py).
    Per-request failures land on their records; only bad options raise (UsageError)."""
    opts.validate()
    if len(arrivals) != len(wreqs):
        raise ValueError(f"{len(wreqs)} requests but {len(arrivals)} arrival times")
    if sessions is not None and opts.lora_modules:
        raise UsageError("--lora-modules applies to single-turn workloads (a session's turns "
                         "keep one model)")
    tokenizer = load_tokenizer(opts.tokenizer) if opts.tokenizer else None
    dispatch = None
    if sessions is not None:
        dispatch = SessionDispatch(opts, sessions, tokenizer)
        n = sessions.num_turns  # one record slot per turn, by its request id
        runner = _Runner(
            # No requests of its own: the sessions' turns fill the slots (http_sessions.py).
            opts, [None] * n, [0.0] * n, [], tokenizer,  # type: ignore[list-item]
            should_stop, on_progress, grace_s, hooks, cancel, sessions=dispatch,
        )
        kinds, total = dispatch.kinds, sessions.active_turns
    else:
        prompts, kinds = build_prompts(wreqs, opts.api, opts.seed, tokenizer)
        runner = _Runner(
            opts, wreqs, arrivals, prompts, tokenizer, should_stop, on_progress, grace_s, hooks,
            cancel,
        )
        if opts.api == "chat" and tokenizer is not None and opts.tokenizer:
            runner.chat_prompt_tokens = chat_prompt_tokens(opts.tokenizer, tokenizer, prompts)
        # Images become chat content parts once the text is final (size_prompts runs first).
        runner.attach_images = partial(attach_images, prompts, wreqs, opts.seed)
        if tokenizer is None:
            runner.size_prompts = partial(size_with_server, wreqs=wreqs, prompts=prompts,
                                          kinds=kinds, seed=opts.seed)
        if opts.lora_modules:
            runner.models = lora_models([w.id for w in wreqs], opts.lora_modules, opts.seed, None)
        total = len(wreqs)
    duration, info = run_client(runner.run())
    info["client_event_loop"] = loop_name()
    info.setdefault("prompt_sizing", "tokenizer" if tokenizer is not None else "approximate")

    records = [rec for rec in runner.records if rec is not None]
    tag_records(records, redact_url(runner.base), info.get("served_model"))
    for line in runner.notes.warnings():
        log.info("warning: " + line)
    finish_http_run(opts, records, runner.methods, kinds, total, info)
    return HttpRun(
        records, duration, runner.stopped, info, total - len(records),
        runner.monitor.lag_ms if runner.monitor is not None else [],
        sessions_ended_early=dispatch.ended_early if dispatch is not None else 0,
        notes=runner.notes,
    )
