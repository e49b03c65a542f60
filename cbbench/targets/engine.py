"""The bundled engine as a benchmark target: build it from options, replay requests, collect
per-request records and per-iteration records.

The simulated engine runs on a virtual clock (deterministic, as fast as the CPU allows); the
torch engine on the wall clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.engine.args import EngineArgs
from cbbench.engine.build import EngineInfo
from cbbench.errors import UsageError
from cbbench.load.cancel import CancelPlan
from cbbench.load.hash_blocks import HashBlockIds
from cbbench.load.session_plan import DEFAULT_VOCAB, SessionPlan
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.engine_feed import CancellingListFeed, CancelTimer, SessionFeed

if TYPE_CHECKING:
    from cbbench.engine.core.engine import StepFailed
    from cbbench.engine.core.feed import RequestFeed

log = logging.getLogger(__name__)


def build_engine(args: EngineArgs):
    """``engine.build.build_engine``, imported when a run needs it. Returns (Engine,
    EngineInfo); a bad option is the one bad-input error, as the engine raised it."""
    from cbbench.engine.build import build_engine as build

    return build(args)


def build_replicas(args: EngineArgs):
    """``engine.build.build_replicas`` (data parallelism). Returns (ReplicaSet, EngineInfo of
    one replica)."""
    from cbbench.engine.build import build_replicas as build

    return build(args)


def resolve_engine(args: EngineArgs) -> str:
    from cbbench.engine.build import resolve_engine as resolve

    return resolve(args)


def engine_config_dict(args: EngineArgs, resolved: EngineInfo | None) -> dict:
    """The result's config for an engine run: every option, what was asked for, and what the
    engine resolved it to."""
    d = args.to_dict()
    d["engine_requested"] = d["engine"]
    if resolved is not None:
        d.update(resolved.to_dict())
    return d


@dataclass
class EngineRun:
    records: list[RequestRecord]
    iterations: list[dict]
    duration_s: float
    interrupted: bool
    resolved: EngineInfo
    not_sent: int = 0
    sessions_ended_early: int = 0  # sessions cut short by a turn the engine rejected
    kv_blocks_in_use_at_end: int = 0  # held by no request once the run is over: must be 0
    # Triton kernels compiled while the run was timed (torch engine; None: not counted).
    kernel_compilations: int | None = None
    # --disaggregate: each request's KV transfer, end of prefill to arrival (link queue included).
    kv_transfer_ms: list[float] | None = None


def _make_requests(
    wreqs: list[WorkloadRequest], arrivals: np.ndarray, opts: EngineArgs, info: EngineInfo
):
    needs_ids = info.engine == "torch"
    # The simulator computes no tokens, but prefix caching hashes prompt ids where the
    # workload has them.
    keep_ids = needs_ids or opts.enable_prefix_caching
    vocab = info.vocab_size or 0
    reqs = []
    for w, t in zip(wreqs, arrivals):
        ids: Sequence[int] | None = None
        # The simulator reads a trace's hash blocks when the prefix cache hashes the request:
        # it computes no tokens, so no copy of every prompt is held for the run.
        hashes = w.hash_ids if not needs_ids and w.prompt_token_ids is None else None
        known = w.token_ids() if keep_ids and hashes is None else None
        if needs_ids:
            if known is not None:
                if max(known) >= vocab:
                    raise UsageError(
                        f"request {w.id}: token id {max(known)} is outside the "
                        f"model's vocabulary of {vocab}"
                    )
                ids = list(known)
            elif w.prompt_len + w.output_len > info.max_model_len:
                ids = None  # rejected at arrival (beyond the context): never build its prompt
            else:
                # Length-only requests get synthetic ids, the same for every run of a seed.
                rng = np.random.default_rng([opts.seed, w.id])
                ids = rng.integers(0, vocab, w.prompt_len).tolist()
        elif keep_ids and hashes is not None:
            ids = HashBlockIds(w.id, hashes, w.prompt_len)
        elif known is not None:
            ids = list(known)
        elif keep_ids:
            # Prefix caching hashes every prompt, as a real engine does: a length-only request
            # gets unique synthetic ids (its hit rate is then a measured 0, not "unknown").
            rng = np.random.default_rng([opts.seed, w.id])
            ids = rng.integers(0, info.vocab_size or DEFAULT_VOCAB, w.prompt_len).tolist()
        reqs.append(_request(opts, info, w.id, w.prompt_len, w.output_len, float(t), ids,
                             w.priority))
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time)  # stable
    return [reqs[i] for i in order]


def _request(opts: EngineArgs, info: EngineInfo, rid: int, prompt_len: int, output_len: int,
             t: float, ids: Sequence[int] | None, priority: int = 0):
    from cbbench.engine.core.request import Request, SamplingParams

    sampling = SamplingParams(
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k,
        # None: the engine's default seed (the run's --seed) mixed with the request's id, so
        # each request draws its own tokens; an explicit seed would key them by the seed alone
        # (engine/torch/sampler.py), every request of the run the same draws.
        seed=None,
        ignore_eos=opts.ignore_eos,
    )
    return Request(
        rid, prompt_len, output_len, arrival_time=t, prompt_token_ids=ids, sampling=sampling,
        priority=priority, eos_token_ids=info.eos_token_ids or (),
    )


def _session_feed(
    plan: SessionPlan, opts: EngineArgs, info: EngineInfo, timer: CancelTimer
) -> SessionFeed:
    # Ids where the engine uses them: the torch engine computes with them, prefix caching
    # hashes them; the simulator then gets scripted replies (engine_feed.py).
    keep_ids = info.engine == "torch" or opts.enable_prefix_caching
    vocab = info.vocab_size or DEFAULT_VOCAB
    if info.engine == "torch":
        check_session_vocab(plan, vocab)
    return SessionFeed(
        plan,
        lambda rid, p, o, t, ids: _request(opts, info, rid, p, o, t, ids),
        keep_ids=keep_ids,
        scripted_replies=keep_ids and info.engine != "torch",
        vocab=vocab,
        timer=timer,
        max_model_len=info.max_model_len,
    )


def check_session_vocab(plan: SessionPlan, vocab: int) -> None:
    """A session turn's token ids are checked before the run, as a request's are
    (_make_requests): one id beyond the vocabulary failed its engine step midway, and with it
    every other session's request in that step."""
    for i in plan.active_sessions:
        for k, turn in enumerate(plan.sessions[i].all_turns):
            if turn.user_token_ids is not None and max(turn.user_token_ids) >= vocab:
                raise UsageError(
                    f"session {plan.sessions[i].session_id} turn {k + 1}: token id "
                    f"{max(turn.user_token_ids)} is outside the model's vocabulary of {vocab}"
                )


def _drain(engine, grace_s: float) -> None:
    """After a stop: drop what has not started, let running requests finish for up to
    ``grace_s`` seconds of wall time, then abort the rest. The engine's one loop drives it,
    with a feed that holds nothing and a stop at the grace deadline."""
    import time

    from cbbench.engine.core.feed import EngineStalled, ListFeed, run_feed

    sched = engine.scheduler
    for req in list(sched.waiting):
        engine.abort_request(req)
    deadline = time.monotonic() + grace_s
    try:
        run_feed(engine, ListFeed([]), should_stop=lambda: time.monotonic() >= deadline)
    except EngineStalled:
        pass  # nothing can run any more: what is left is aborted below, as at the deadline
    for req in list(sched.running) + list(sched.waiting):
        engine.abort_request(req)


def _drain_all(engine, grace_s: float) -> None:
    """``_drain`` each engine of the run. A replica's (or a disaggregated instance's) drain
    steps are labelled with its index and pool, as the set's own loop labels its steps: an
    unlabelled record has no place in the set's (start, replica) order."""
    members = getattr(engine, "replicas", None)
    if members is None:
        _drain(engine, grace_s)
        return
    for member in members:
        e = member.engine
        before = e.num_records
        _drain(e, grace_s)
        records = list(e.records)
        for rec in records[len(records) - (e.num_records - before):]:
            rec.replica = member.index
            rec.pool = getattr(member, "pool", None)


def _outcome(r, cancelled: bool) -> tuple[str | None, str | None]:
    """A request's (error, error_type) at the end of a run; (None, None) when it finished or
    was cancelled (counted apart: neither completed nor failed)."""
    from cbbench.engine.core.request import RequestStatus

    if cancelled or r.status == RequestStatus.FINISHED:
        return None, None
    if r.status == RequestStatus.REJECTED:
        return r.finish_reason, "rejected"
    if r.status == RequestStatus.FAILED:
        return r.finish_reason, "engine_error"
    if r.status == RequestStatus.ABORTED:
        return "cancelled by the interrupt", "interrupted"
    return "run interrupted before the request finished", "interrupted"


def _records(reqs, wreqs, timer: CancelTimer, session_feed, keep_token_ids: bool):
    """The run's request records, and how many requests never reached the engine."""
    from cbbench.engine.core.request import RequestStatus

    records = []
    reasoning = {w.id: w.reasoning_len for w in wreqs if w.reasoning_len}
    not_sent = session_feed.not_created if session_feed is not None else 0
    for r in reqs:
        if r.status == RequestStatus.WAITING and r.first_scheduled_time is None:
            # Never reached the engine (its arrival came after the stop).
            not_sent += 1
            continue
        cancelled = r.request_id in timer.cancelled
        error, error_type = _outcome(r, cancelled)
        records.append(
            RequestRecord(
                id=r.request_id,
                prompt_tokens=r.num_prompt_tokens,
                output_tokens=r.num_output_tokens,
                intended_start_s=r.arrival_time,
                send_s=r.arrival_time,
                token_times_s=r.token_times,
                error=error,
                error_type=error_type,
                output_token_ids=(
                    list(r.output_token_ids)
                    if keep_token_ids and r.prompt_token_ids is not None
                    else None
                ),
                num_preemptions=r.num_preemptions,
                first_scheduled_s=r.first_scheduled_time,
                priority=r.priority,
                cancelled=cancelled,
                max_tokens=r.max_tokens,
            )
        )
        if session_feed is not None:
            records[-1].session_id, records[-1].turn = session_feed.labels(r)
            records[-1].turn_kind = session_feed.turn_kind(r)
            records[-1].agent = session_feed.agent(r)
            records[-1].waited_from_s = session_feed.waited_from.get(r.request_id)
        elif r.request_id in reasoning:
            split_reasoning(records[-1], reasoning[r.request_id])
    return records, not_sent


def split_reasoning(rec: RequestRecord, reasoning_len: int) -> None:
    """The workload's reasoning_len on an in-process record: its first reasoning_len tokens
    were reasoning, the first output token the one after them."""
    n = len(rec.token_times_s)
    rec.reasoning_tokens = min(reasoning_len, n)
    rec.first_output_s = rec.token_times_s[reasoning_len] if n > reasoning_len else None


def _step_callback(engine, total: int, on_progress, live):
    """The feed's per-step callback: progress (done of total) and the live view's finished
    requests, only on steps that finished some. Attaches the live view to the engine."""
    if live is not None:
        live.attach_engine(engine)
    done = [0]

    def on_step(step) -> None:
        if not step.finished:
            return
        if live is not None:
            live.on_finished(step.finished)
        if on_progress is not None:
            done[0] += len(step.finished)
            on_progress(done[0] + len(engine.rejected), total)

    return on_step


def run_engine(
    opts: EngineArgs,
    wreqs: list[WorkloadRequest],
    arrivals: np.ndarray,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    keep_token_ids: bool = False,
    prepare: Callable[[], None] | None = None,
    on_start: Callable[[object], None] | None = None,
    grace_s: float = 10.0,
    sessions: SessionPlan | None = None,
    cancel: CancelPlan | None = None,
    step_time_factors: dict[str, float] | None = None,
    live=None,
) -> EngineRun:
    """``prepare()`` is called once the engine is built, before the run's clock starts: what
    takes time to set up (telemetry's imports and NVML start-up) goes there, so requests
    arriving at t=0 do not wait on it at an idle engine. ``on_start(clock)`` is called at the
    clock's zero (telemetry lines up with it) and must be quick, for the same reason.
    With ``sessions``, the plan's turns are sent instead of ``wreqs``/``arrivals``; with
    ``cancel``, the requests it picks are aborted mid-flight; with ``step_time_factors``
    (the simulator), each step's time is scaled by its iteration class's factor; ``live``
    (a LiveBoard, targets/live.py) reads the engine's records and its finished requests."""
    from cbbench.engine.core.feed import ListFeed, run_feed

    # run_feed drives one engine; run_replicas a replica set or a disaggregated pair, whichever
    # of the two branches below built
    loop: Callable[..., bool] = run_feed
    if opts.data_parallel_size > 1 or opts.disaggregate is not None:
        from cbbench.engine.sim.replicas import run_replicas

        engine, info = build_replicas(opts)
        loop = run_replicas
    else:
        engine, info = build_engine(opts)
    if step_time_factors is not None:
        from cbbench.engine.sim.sim_bounds import ScaledExecutor

        for e in engine.engines:
            e.executor = ScaledExecutor(e.executor, step_time_factors)
    session_feed = None
    timer = CancelTimer(cancel)
    feed: RequestFeed
    if sessions is not None:
        feed = session_feed = _session_feed(sessions, opts, info, timer)
        reqs = session_feed.created
        total = sessions.num_turns
    else:
        reqs = _make_requests(wreqs, arrivals, opts, info)
        feed = CancellingListFeed(reqs, timer) if cancel is not None else ListFeed(reqs)
        total = len(reqs)
    on_step = _step_callback(engine, total, on_progress, live)

    if prepare is not None:
        prepare()
    clock = engine.clock
    if clock.realtime:
        clock.reset()
    if on_start is not None:
        on_start(clock)
    step_failures: list[StepFailed] = []

    def on_step_failed(e) -> None:
        # The failed requests carry the error in the result; say it once, as it happens.
        if not step_failures:
            log.info(f"warning: an engine step failed ({e}): its {len(e.requests)} request(s) "
                   "failed; the run goes on")
        step_failures.append(e)

    completed_all = loop(
        engine, feed, should_stop=should_stop, on_step=on_step, on_step_failed=on_step_failed
    )
    if not completed_all:
        _drain_all(engine, grace_s)
    end = clock.now()

    records, not_sent = _records(reqs, wreqs, timer, session_feed, keep_token_ids)
    finish_times = [r.finish_time for r in reqs if r.finish_time is not None]
    duration = end if not completed_all else max(finish_times, default=0.0)
    if math.isinf(duration):
        duration = 0.0
    iterations = [it.to_dict() for it in engine.records]
    run = EngineRun(records, iterations, duration, not completed_all, info, not_sent)
    # Every request has ended: whatever KV is still held leaked (aborts must free theirs).
    run.kv_blocks_in_use_at_end = sum(
        e.block_manager.num_used_blocks for e in engine.engines
    )
    if session_feed is not None:
        run.sessions_ended_early = session_feed.ended_early
    run.kv_transfer_ms = getattr(engine, "kv_transfer_ms", None)
    count = getattr(engine.executor, "kernel_compilations_since_ready", None)
    run.kernel_compilations = count() if count is not None else None
    return run
