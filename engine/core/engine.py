"""The engine: schedule -> execute -> postprocess, once per iteration, on a clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .block_manager import BlockManager
from .iteration import IterationRecord
from .prefix_caching import PrefixCachingBlockManager
from .request import Request, RequestStatus
from .scheduler import Scheduler, SchedulerConfig
from .scheduler_output import ExecutorOutput, IterationCost, SchedulerOutput
from .spec_decode import Drafter


class Executor(Protocol):
    def execute(self, sched: SchedulerOutput) -> ExecutorOutput: ...


class StepCostModel(Protocol):
    """The analytic cost of a step the executor ran for real (engine/sim/cost_model.py's
    CostModel): the engine core names what it asks, not the simulator that answers."""

    def step_cost(self, sched: SchedulerOutput, block_size: int) -> IterationCost: ...


class DecodeCostModel(Protocol):
    """An executor that prices a step of decodes alone in closed form, from its rows and the
    keys they read (the simulator's: engine/sim/sim_executor.py): what fast_forward asks."""

    def decode_cost(self, num_rows: int, decode_keys: float) -> IterationCost: ...

    def min_step_s(self) -> float | None: ...  # a floor under every step's time


# Fewer steps than this are not worth a stretch's set-up: one is just a step.
MIN_STRETCH = 2


class Clock(Protocol):
    realtime: bool

    def now(self) -> float: ...
    def advance_to(self, t: float) -> None: ...
    def sleep_until(self, t: float) -> None: ...
    def begin_step(self, back_to_back: bool) -> None: ...


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig
    num_kv_blocks: int
    block_size: int = 16
    kv_allocation: str = "paged"
    # Swap preemption's CPU pool, in blocks (0: every preemption recomputes).
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = False


class StepFailed(Exception):
    """The executor raised during a step. The engine cannot tell which request caused it, so
    it failed every request of that step (status FAILED, the error as finish_reason, their KV
    freed); the engine itself is whole: the caller reports them and keeps stepping."""

    def __init__(self, requests: list[Request], cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.requests = requests
        self.cause = cause


@dataclass(slots=True)
class StepOutput:
    """One step's result. ``num_new_tokens[i]``: the tokens ``scheduled.scheduled_reqs[i]``
    gained this step (0 for a partial prefill chunk; 1 for a decode or a completed prefill;
    1 + accepted drafts with speculative decoding, fewer when it finished inside the run).
    They are the last ``num_new_tokens[i]`` entries of its ``token_times`` (all the step's end
    time) and, where ids are modelled, of its ``output_token_ids``: a server sends them as one
    event (docs/speculative.md)."""

    record: IterationRecord
    scheduled: SchedulerOutput
    finished: list[Request]
    num_new_tokens: list[int] = field(default_factory=list)

    def new_token_ids(self, i: int) -> list[int] | None:
        """The ids of the tokens request ``i`` gained (None where ids are not modelled)."""
        req, n = self.scheduled.scheduled_reqs[i], self.num_new_tokens[i]
        ids = req.output_token_ids
        if n == 0 or len(ids) < req.num_output_tokens:
            return None if n else []
        return ids[len(ids) - n :]


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        clock: Clock,
        cost_model: StepCostModel | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        """``drafter``: speculative decoding's proposer, asked after every step for the
        requests that will decode next (None: speculation off)."""
        self.config = config
        self.drafter = drafter
        pool = PrefixCachingBlockManager if config.enable_prefix_caching else BlockManager
        self.block_manager = pool(config.num_kv_blocks, config.block_size, config.kv_allocation)
        self.cpu_block_manager = (
            BlockManager(config.num_cpu_blocks, config.block_size)
            if config.num_cpu_blocks > 0
            else None
        )
        self.scheduler = Scheduler(config.scheduler, self.block_manager, self.cpu_block_manager)
        self._caching = config.enable_prefix_caching
        self.executor = executor
        self.clock = clock
        self.cost_model = cost_model
        # The simulator's executor, set by its builder (engine/build_sim.py) unless
        # --no-fast-forward: while it is the executor, the loops (core/feed.py,
        # sim/replicas.py) ask fast_forward before each step.
        self.decode_cost_model: DecodeCostModel | None = None
        # The iteration records: every one (a run), or only the most recent (a long-lived
        # server, see keep_recent_records). Indices count every step ever recorded.
        self.records: list[IterationRecord] | deque[IterationRecord] = []
        self.num_records = 0
        self.rejected: list[Request] = []
        # Requests whose finish leaves their blocks allocated: a disaggregated prefill
        # instance's, freed once their KV has crossed the link (engine/sim/disaggregated.py).
        self.kv_to_send: set[int] = set()

    # ---- requests ---------------------------------------------------------------------------
    def add_request(self, req: Request) -> str | None:
        """Queue ``req``; a request that can never fit is rejected at once, with the reason.
        An exception while taking it in fails that request alone (status FAILED, the error as
        its reason, which is returned), never the engine."""
        try:
            reason = self.scheduler.rejection_reason(req)
            if reason is None:
                self.scheduler.add_request(req)
                return None
        except Exception as e:
            if req in self.scheduler.waiting:
                self.scheduler.remove(req)
            req.status = RequestStatus.FAILED
            req.finish_reason = f"the engine could not take this request: {type(e).__name__}: {e}"
            req.finish_time = self.clock.now()
            return req.finish_reason
        req.status = RequestStatus.REJECTED
        req.finish_reason = reason
        req.finish_time = self.clock.now()
        self.rejected.append(req)
        return reason

    def abort_request(self, req: Request) -> None:
        if req.status.is_done:
            return
        self.scheduler.remove(req)
        req.status = RequestStatus.ABORTED
        req.finish_reason = "abort"
        req.finish_time = self.clock.now()

    def reset_prefix_cache(self) -> bool:
        """POST /reset_prefix_cache (vLLM's semantics): drop every cached prefix; False while a
        request still holds KV blocks (nothing is dropped then)."""
        return self.block_manager.reset_prefix_cache()
    @property
    def engines(self) -> list[Engine]:
        """EngineLike's (core/engine_like.py): one engine is made of itself."""
        return [self]

    def append_record(self, record: IterationRecord) -> None:
        """One step's record, numbered by ``num_records`` (the steps ever recorded)."""
        self.records.append(record)
        self.num_records += 1

    def keep_recent_records(self, maxlen: int) -> None:
        """Keep only the ``maxlen`` most recent iteration records from now on, so a long-lived
        server's memory stays flat; the oldest drop as new ones arrive, and indices keep
        counting (they never repeat)."""
        if maxlen < 1:
            raise ValueError("keep at least one iteration record")
        self.records = deque(self.records, maxlen=maxlen)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- one iteration ----------------------------------------------------------------------
    def step(self) -> StepOutput | None:
        """Run one iteration; None when nothing could be scheduled."""
        clock = self.clock
        start = clock.now()
        sched = self.scheduler.schedule(start)
        if sched.is_empty and not sched.has_swaps:
            return None
        num_running = len(self.scheduler.running)
        num_waiting = len(self.scheduler.waiting)
        kv_used = self.block_manager.num_used_blocks

        try:
            out = self.executor.execute(sched)
        except Exception as e:
            raise self._fail_step(sched, e) from e
        if out.duration_s is not None:
            clock.advance_to(start + out.duration_s)
        end = clock.now()
        cost = out.cost
        if cost is None and self.cost_model is not None:  # a real executor: analytic figures
            cost = self.cost_model.step_cost(sched, self.config.block_size)

        finished, gained, spec = self._postprocess(sched, out, end)
        record = self._record(start, end, sched, cost, num_running, num_waiting, kv_used,
                              out.swap_time_s, spec)
        self.append_record(record)
        return StepOutput(record, sched, finished, gained)

    def _record(self, start: float, end: float, sched: SchedulerOutput,
                cost: IterationCost | None, num_running: int, num_waiting: int, kv_used: int,
                swap_time_s: float, spec: _StepTokens) -> IterationRecord:
        """One step's record: the schedule, its cost and what it emitted."""
        shape = cost.shape if cost is not None else None
        return IterationRecord(
            index=self.num_records,
            start_s=start,
            duration_s=end - start,
            num_prefill_tokens=sched.num_prefill_tokens,
            num_decode_tokens=sched.num_decode_tokens,
            token_budget=sched.token_budget,
            num_prefill_reqs=sched.num_prefill_reqs,
            num_decode_reqs=sched.num_decode_reqs,
            num_running=num_running,
            num_waiting=num_waiting,
            num_preempted=len(sched.preempted),
            kv_blocks_used=kv_used,
            kv_blocks_total=self.block_manager.num_blocks,
            bytes_moved=cost.bytes if cost is not None else 0.0,
            flops=cost.flops if cost is not None else 0.0,
            num_swapped_out_blocks=len(sched.swap_out),
            num_swapped_in_blocks=len(sched.swap_in),
            swap_time_s=swap_time_s,
            num_cached_tokens=sched.num_cached_tokens,
            num_prefix_queried_tokens=sched.num_prefix_queried_tokens,
            num_preempted_cached_tokens=sched.num_preempted_cached_tokens,
            num_preempted_queried_tokens=sched.num_preempted_queried_tokens,
            predicted_s=cost.time_s if cost is not None else None,
            num_logits=shape.num_logits if shape is not None else 0,
            attn_key_pairs=shape.attn_key_pairs if shape is not None else 0.0,
            attn_keys_read=shape.attn_keys_read if shape is not None else 0.0,
            attn_decode_keys=shape.decode_keys if shape is not None else 0.0,
            num_drafts=sched.num_drafts,
            draft_tokens=sched.num_draft_tokens,
            accepted_tokens=spec.accepted,
            emitted_tokens=spec.emitted,
            num_sampled_reqs=spec.sampled_reqs,
        )

    def fast_forward(self, horizon: float,
                     on_step: Callable[[StepOutput], None] | None = None) -> int:
        """Advance the decode-only steps that start before ``horizon`` (the next event) in
        one move, leaving the engine exactly as stepping would: the same clock, token times,
        block tables and records (``on_step`` hears each). Returns how many (0: step
        normally). The scheduler says which steps (Scheduler.decode_stretch); only with
        ``decode_cost_model`` as the executor, no drafter (one token per row) and a virtual
        clock. --no-fast-forward steps every iteration: the reference (test_sim_scale.py)."""
        pricer = self.decode_cost_model
        clock = self.clock
        if pricer is None or pricer is not self.executor or self.drafter is not None \
                or clock.realtime or self.scheduler.waiting:
            return 0
        # Room for a second step before the horizon? Asked first, as it costs nothing per row
        # (under dense arrivals there rarely is; a one-step stretch is just a step).
        if clock.now() + (pricer.min_step_s() or 0.0) >= horizon:
            return 0
        stretch = self.scheduler.decode_stretch(MIN_STRETCH)
        if stretch is None:
            return 0
        sched = stretch.sched
        rows = sched.scheduled_reqs
        n = len(rows)
        dec_keys = sum([r.num_computed_tokens for r in rows]) + n  # grows by n a step
        tokens = _StepTokens(0, n, n)
        bm = self.block_manager
        times: list[float] = []
        for j in range(stretch.num_steps):
            start = clock.now()
            if start >= horizon or not stretch.take_blocks(j):
                break
            cost = pricer.decode_cost(n, float(dec_keys + j * n))
            assert cost.time_s is not None  # a simulated executor has rates
            clock.advance_to(start + cost.time_s)
            end = clock.now()
            times.append(end)
            record = self._record(start, end, sched, cost, n, 0, bm.num_used_blocks, 0.0,
                                  tokens)
            self.append_record(record)
            if on_step is not None:
                on_step(StepOutput(record, sched, []))
        k = len(times)
        for r in rows:  # _advance_counted's decode rows, k steps at once
            r.num_computed_tokens += k
            r.num_output_tokens += k
            r.token_times.extend(times)
        return k

    def _fail_step(self, sched: SchedulerOutput, cause: Exception) -> StepFailed:
        """Fail the step's requests, and those it swapped out (their KV copy may not have
        happened): one bad request must not take the engine, or the server, down with it."""
        failed = list(sched.scheduled_reqs)
        failed += [r for r in sched.preempted if r.status == RequestStatus.SWAPPED]
        err = StepFailed(failed, cause)
        now = self.clock.now()
        for req in failed:
            self.block_manager.forget_uncomputed(req)  # registered as scheduled, never written
            self.scheduler.remove(req)
            req.status = RequestStatus.FAILED
            req.finish_reason = f"the engine failed on this request's batch: {err}"
            req.finish_time = now
        return err

    def _postprocess(
        self, sched: SchedulerOutput, out: ExecutorOutput, now: float
    ) -> tuple[list[Request], list[int], _StepTokens]:
        """Advance each scheduled request by its rows and append the tokens it gained: one
        sampled token, after its accepted drafts with speculative decoding (their KV stays; the
        rejected drafts' slots are rolled back). Returns the finished requests, the tokens each
        scheduled request gained, and the step's token counts."""
        if out.sampled_token_ids is None and out.num_accepted is None and self.drafter is None:
            finished, gained = self._advance_counted(sched, now)
            for req in finished:  # nothing above touched the KV pool: free in row order now
                self._finish(req, now)
            num_accepted = 0
        else:
            finished, gained, num_accepted = self._advance_sampled(sched, out, now)
        reqs = sched.scheduled_reqs
        if finished:
            self.scheduler.drop_finished()
        if self.drafter is not None:
            propose = self.drafter.propose
            for i in range(len(reqs)):
                req = reqs[i]
                if gained[i] and req.status == RequestStatus.RUNNING:
                    req.spec_token_ids = propose(req)
        if self._caching:
            self._register_filled_blocks(reqs)
        counts = _StepTokens(num_accepted, sum(gained), len(gained) - gained.count(0))
        return finished, gained, counts

    def _finish(self, req: Request, now: float) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_time = now
        if req.request_id in self.kv_to_send:
            return
        self.block_manager.free(req)  # with prefix caching, registers its last full blocks

    def _advance_counted(
        self, sched: SchedulerOutput, now: float
    ) -> tuple[list[Request], list[int]]:
        """The simulator's rows (no token ids, no drafts): every decode row, and every prefill
        chunk that completes its prompt, gains one token. The decode rows come first, one token
        each (SchedulerOutput), so they need no test of whether the row completes."""
        reqs = sched.scheduled_reqs
        nd = sched.num_decode_reqs
        finished: list[Request] = []
        for req in reqs[:nd] if nd < len(reqs) else reqs:
            req.num_computed_tokens += 1
            o = req.num_output_tokens + 1
            req.num_output_tokens = o
            req.token_times.append(now)
            if o >= req.max_tokens:
                req.finish_reason = "length"
                finished.append(req)
        gained = [1] * nd
        nums = sched.num_scheduled_tokens
        for i in range(nd, len(reqs)):
            req = reqs[i]
            c = req.num_computed_tokens + nums[i]
            req.num_computed_tokens = c
            if c < req.num_prompt_tokens + req.num_output_tokens:
                gained.append(0)  # a partial prefill chunk: no token yet
                continue
            gained.append(1)
            req.num_output_tokens += 1
            req.token_times.append(now)
            if req.num_output_tokens >= req.max_tokens:
                req.finish_reason = "length"
                finished.append(req)
        return finished, gained

    def _advance_sampled(
        self, sched: SchedulerOutput, out: ExecutorOutput, now: float
    ) -> tuple[list[Request], list[int], int]:
        """Rows with sampled token ids (torch) or verified drafts. Returns the finished
        requests, the tokens each request gained and the drafts accepted."""
        finished: list[Request] = []
        reqs = sched.scheduled_reqs
        nums = sched.num_scheduled_tokens
        sampled = out.sampled_token_ids
        gained = [0] * len(reqs)
        num_accepted = 0
        for i in range(len(reqs)):
            req = reqs[i]
            req.num_computed_tokens += nums[i]
            if req.num_computed_tokens < req.num_tokens:
                continue  # a partial prefill chunk: no token yet
            token = sampled[i] if sampled is not None else None
            if req.spec_token_ids:
                assert out.num_accepted is not None, "a step with drafts reports their acceptance"
                a = out.num_accepted[i]
                num_accepted += a
                gained[i] = self._append_verified(req, a, token, sampled is not None, now)
            else:
                gained[i] = 1
                self._append_token(req, token, sampled is not None, now)
            if req.finish_reason is not None:
                # Freed here, in row order between the other rows' draft rollbacks (trim).
                self._finish(req, now)
                finished.append(req)
        return finished, gained, num_accepted

    @staticmethod
    def _append_token(req: Request, token: int | None, with_ids: bool, now: float) -> None:
        """One sampled token (None where ids are not modelled), and its finish if any."""
        req.num_output_tokens += 1
        req.token_times.append(now)
        if with_ids:
            assert token is not None, "a row that ends its prompt or decodes samples a token"
            req.output_token_ids.append(token)
        if req.num_output_tokens >= req.max_tokens:
            req.finish_reason = "length"
        elif token is not None and stops(req, token):
            req.finish_reason = "stop"

    def _register_filled_blocks(self, reqs: list[Request]) -> None:
        """Prefix caching: blocks that filled this step become findable (finished requests did
        so on free)."""
        bm = self.block_manager
        bs = bm.block_size
        for req in reqs:
            # Cheap test first: has a block of known token ids filled since the last
            # registration? (The simulator knows prompt ids at most, never output ids.)
            if req.prompt_token_ids is None or not req.block_table:
                continue
            known = req.num_prompt_tokens + len(req.output_token_ids)
            c = req.num_computed_tokens
            if (c if c < known else known) >= (req.num_registered_blocks + 1) * bs:
                bm.register_full_blocks(req)

    def _append_verified(
        self, req: Request, num_accepted: int, token: int | None, with_ids: bool, now: float
    ) -> int:
        """A verified decode: roll back its rejected drafts' KV, then append its accepted
        drafts and the sampled token, stopping at a finish inside that run. Returns the tokens
        appended."""
        drafts = req.spec_token_ids
        req.spec_token_ids = []
        rejected = len(drafts) - num_accepted
        req.num_computed_tokens -= rejected
        n = 0
        for t in (*drafts[:num_accepted], token):
            n += 1
            req.num_output_tokens += 1
            req.token_times.append(now)
            if with_ids:
                assert t is not None, "a verified row samples a token"
                req.output_token_ids.append(t)
            if req.num_output_tokens >= req.max_tokens:
                req.finish_reason = "length"
                break
            if with_ids and stops(req, t):
                req.finish_reason = "stop"
                break  # the rest of the run is dropped
        if rejected and req.finish_reason is None:
            self.block_manager.trim(req, req.num_computed_tokens)
        return n


def stops(req: Request, token: int | None) -> bool:
    """Whether a sampled token finishes ``req``: one of the model's end-of-sequence ids (unless
    it ignores EOS), or one of its own stop_token_ids (ignore_eos or not, as vLLM's)."""
    sp = req.sampling
    return (token in req.eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids


@dataclass(slots=True)
class _StepTokens:
    """One step's output-token counts, for its iteration record."""

    accepted: int = 0  # draft tokens verification accepted
    emitted: int = 0  # tokens appended to outputs
    sampled_reqs: int = 0  # requests that gained tokens

