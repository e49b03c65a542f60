"""The scheduler: once per iteration, decide ``{request: number of new tokens}``.

``continuous`` (iteration-level, Orca/vLLM): running decodes first, then unfinished prefill
chunks, then new admissions while the token budget, sequence slots and KV blocks allow. With
chunked prefill a long prompt is split across iterations so decodes keep moving (Sarathi-Serve's
stall-free rule). When KV runs out a running request is preempted: the newest (``fcfs``) or the
lowest-priority, newest among equals (``priority``).

``static``: a batch is admitted only when nothing is running, and runs until its last member
finishes; finished members leave idle slots.

Three policies vLLM's scheduler is known for, each off by default:

- **preemption mode** ``recompute`` frees the victim's blocks and it goes back to the queue with
  ``num_computed_tokens = 0``; ``swap`` copies its computed blocks to a CPU pool (status SWAPPED)
  and back when it resumes, falling back to recompute when the CPU pool is full. The copies are
  listed in the output (``swap_out`` then ``swap_in``) for the executor to do before the
  forward.
- **queue policy** ``fcfs`` admits in arrival order; ``priority`` admits by (priority, arrival)
  and lets a request that cannot get KV preempt a strictly lower-priority running one (vLLM
  V0's rule: V1's admissions never preempt, only its running requests' growth does).
- **prefix caching** (a ``PrefixCachingBlockManager``): an admitted request starts after its
  longest cached prefix.

One path serves every combination: with the policies off their branches cost nothing (the
plain ``BlockManager``'s prefix hooks are trivial, no swap copy is ever listed). What one
``schedule()`` call accumulates (the plan, preemptions, swap copies, prefix-cache counts) lives in
a ``_Step`` made fresh for that call, never on the scheduler.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager, cdiv
from .request import Request, RequestStatus
from .request_queue import PriorityRequestQueue, priority_key
from .scheduler_config import SchedulerConfig
from .scheduler_output import SchedulerOutput


def _is_decode(req: Request) -> bool:
    """One known token left to compute, after the prompt: a decode row."""
    c = req.num_computed_tokens
    return c >= req.num_prompt_tokens and req.num_tokens - c == 1


class _Step:
    """What one ``schedule()`` call accumulates, made fresh for each call."""

    __slots__ = (
        "sched", "preempted", "swap_out", "swap_in", "swapped_in", "num_decodes_taken",
        "num_cached_tokens", "num_queried_tokens", "num_preempted_cached_tokens",
        "num_preempted_queried_tokens", "late_decodes", "num_drafts",
        "num_draft_tokens",
    )  # fmt: skip

    def __init__(self) -> None:
        self.sched: dict[Request, int] = {}  # the plan, in scheduling order
        self.preempted: list[Request] = []
        # Swap preemption's KV copies: (GPU, CPU) block pairs out, (CPU, GPU) pairs in, and the
        # pairs of each request swapped in (its CPU blocks are freed when the step ends).
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.swapped_in: dict[Request, list[tuple[int, int]]] = {}
        self.num_decodes_taken = 0  # decode tokens taken back from preempted victims
        self.num_cached_tokens = 0  # prefix caching: hits among the prefills started ...
        self.num_queried_tokens = 0  # ... and those requests' known tokens
        # The same for requests resumed after a recompute preemption (vLLM's preempted_hits
        # and preempted_queries): they find their own blocks again, which is no hit rate.
        self.num_preempted_cached_tokens = 0
        self.num_preempted_queried_tokens = 0
        self.late_decodes = False  # an admission scheduled a decode (after the prefills)
        # Speculative decoding: decodes scheduled with draft rows, and those rows (net of any
        # taken back from preempted victims).
        self.num_drafts = 0
        self.num_draft_tokens = 0


@dataclass(slots=True)
class DecodeStretch:
    """Steps of decodes alone from the next one on (``Scheduler.decode_stretch``): each
    schedules ``sched`` (every running request one token) and none ends a request.
    ``take_blocks(j)`` gives step ``j``'s rows the KV blocks ``schedule()``'s decode loop would
    give them, in its order; the rows advance after the stretch (Engine.fast_forward), so at
    step ``j`` each row's computed tokens are ``j`` short of the stepped run's."""

    sched: SchedulerOutput
    num_steps: int
    bm: BlockManager
    crossings: dict[int, list[Request]]  # step -> the rows whose next token starts a block

    def take_blocks(self, j: int) -> bool:
        """Step ``j``'s new blocks; False (and none taken) when the pool is short: that step
        would preempt, so it is scheduled for real."""
        rows = self.crossings.get(j)
        if not rows:
            return True
        bm = self.bm
        if len(rows) > bm.num_free_blocks:
            return False
        for r in rows:
            ok = bm.allocate(r, r.num_computed_tokens + j + 1)
            assert ok
        return True


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        cpu_block_manager: BlockManager | None = None,
    ) -> None:
        self.config = config
        self.bm = block_manager
        # Swap preemption's CPU pool; None (or recompute mode) means every preemption recomputes.
        self.cpu_bm = cpu_block_manager if config.preemption_mode == "swap" else None
        self._priority = config.queue_policy == "priority"
        self.waiting: deque[Request] | PriorityRequestQueue = (
            PriorityRequestQueue() if self._priority else deque()
        )
        self.running: list[Request] = []  # in admission order: the last is the newest
        self._static = config.batching == "static"
        self._caching = block_manager.enable_prefix_caching
        self._num_added = 0

    # ---- queue management -------------------------------------------------------------------
    def rejection_reason(self, req: Request) -> str | None:
        """Why ``req`` can never run, or None. Checked once, at arrival, so nothing starves."""
        cfg = self.config
        if req.num_prompt_tokens < 1 or req.max_tokens < 1:
            return "prompt and output lengths must be at least 1 token"
        if req.max_total_tokens > cfg.max_model_len:
            return (
                f"prompt ({req.num_prompt_tokens}) + output ({req.max_tokens}) tokens exceed "
                f"the model's context of {cfg.max_model_len}"
            )
        need = self.bm.max_blocks(req)
        if need > self.bm.num_blocks:
            return f"needs {need} KV blocks but the whole pool has {self.bm.num_blocks}"
        # Without chunking, a recompute after preemption must fit one iteration's budget.
        if not cfg.chunked_prefill and req.max_total_tokens - 1 > cfg.max_num_batched_tokens:
            return (
                f"prompt + output ({req.max_total_tokens}) exceed max_num_batched_tokens "
                f"({cfg.max_num_batched_tokens}) with chunked prefill off"
            )
        return None

    def add_request(self, req: Request, kv_elsewhere: bool = False) -> None:
        """Queue ``req``. ``kv_elsewhere``: its computed tokens' KV waits outside this pool
        (sent by a disaggregated prefill instance, engine/sim/disaggregated.py): it resumes as
        a swapped-out request does, with no CPU blocks to copy in."""
        req.status = RequestStatus.SWAPPED if kv_elsewhere else RequestStatus.WAITING
        req.queue_seq = self._num_added
        self._num_added += 1
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Take an aborted request out of whichever queue holds it and free its blocks (GPU,
        and CPU when it was swapped out)."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.bm.free(req)
        if req.cpu_block_table:
            assert self.cpu_bm is not None, "only swap preemption fills a CPU block table"
            self.cpu_bm.free_blocks(req.cpu_block_table)
            req.cpu_block_table = []

    def drop_finished(self) -> None:
        self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- preemption -------------------------------------------------------------------------
    def _preempt(self, step: _Step) -> tuple[Request, int, int, bool]:
        """Preempt one running request to free its KV: the newest (fcfs), or the
        lowest-priority, newest among equals (priority). Returns the victim, its index in
        ``running`` before removal, the tokens it had been given this step (0 when none: the
        caller takes them back) and whether those were a decode."""
        running = self.running
        if self._priority:
            idx = max(range(len(running)), key=lambda i: priority_key(running[i]))
            victim = running.pop(idx)
        else:
            idx = len(running) - 1
            victim = running.pop()
        taken = step.sched.pop(victim, 0)
        was_decode = taken > 0 and _is_decode(victim)
        if taken:
            self.bm.forget_uncomputed(victim)  # registered as scheduled: never computed now
        if victim.spec_token_ids:
            if was_decode and taken > 1:  # its draft rows were scheduled: take them back
                step.num_drafts -= 1
                step.num_draft_tokens -= taken - 1
            victim.spec_token_ids = []  # drafts of a token it will recompute
        victim.num_preemptions += 1
        step.preempted.append(victim)
        if victim in step.swapped_in:
            # Swapped in this very step: its KV never left the CPU pool. Cancel the copy in.
            self._cancel_swap_in(victim, step)
        elif not self._swap_out_blocks(victim, step):
            self.bm.free(victim)
            victim.num_computed_tokens = 0
            victim.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(victim)
        return victim, idx, taken, was_decode

    def _swap_out_blocks(self, victim: Request, step: _Step) -> bool:
        """Swap preemption: give the victim CPU blocks for its computed KV, list the copies and
        free its GPU blocks. False (nothing changed) when swap is off or the CPU pool is short:
        the caller recomputes instead."""
        cpu = self.cpu_bm
        if cpu is None:
            return False
        n = cdiv(victim.num_computed_tokens, self.bm.block_size)
        if n == 0:
            return False
        cpu_blocks = cpu.allocate_blocks(n)
        if cpu_blocks is None:
            return False
        step.swap_out.extend(zip(victim.block_table[:n], cpu_blocks))
        victim.cpu_block_table = cpu_blocks
        self.bm.free(victim)  # the copies run before the forward: the blocks may be reused now
        victim.status = RequestStatus.SWAPPED
        return True

    def _swap_in_blocks(self, req: Request, num_tokens: int, step: _Step) -> bool:
        """Give a SWAPPED request GPU blocks for ``num_tokens`` and list the copies of its CPU
        blocks into the first of them. Its CPU blocks are freed at the end of the step, after
        every swap-out of the step has picked its CPU blocks, so none is overwritten before it
        is read."""
        if not self.bm.allocate(req, num_tokens):
            return False
        pairs = list(zip(req.cpu_block_table, req.block_table))
        if pairs:  # none for KV that arrives from another instance (engine/disaggregated.py)
            step.swap_in.extend(pairs)
            step.swapped_in[req] = pairs
        return True

    def _cancel_swap_in(self, req: Request, step: _Step) -> None:
        dropped = set(step.swapped_in.pop(req))
        step.swap_in = [p for p in step.swap_in if p not in dropped]
        self.bm.discard(req)  # nothing was written to them
        req.status = RequestStatus.SWAPPED

    def _preempt_for(self, req: Request, step: _Step) -> int | None:
        """Priority: preempt the lowest-priority running request if it ranks strictly below
        ``req``. Returns the tokens taken back from it, or None when nothing ranks below."""
        running = self.running
        if not running:
            return None
        lowest = max(running, key=priority_key)
        if lowest.priority <= req.priority:
            return None
        if lowest in step.sched and self.bm.shares_uncomputed(lowest):
            return None  # an admission of this step reads the KV it writes in this step
        victim, _, taken, was_decode = self._preempt(step)
        assert victim is lowest
        step.num_decodes_taken += was_decode
        return taken

    def decode_stretch(self, min_steps: int) -> DecodeStretch | None:
        """The steps from the next one on while they are decodes alone, one row per running
        request (continuous batching, nothing waiting, every running request past its prompt
        with one token to compute, all within the token budget), before the step in which a
        request would finish (a finish changes the batch: that step is scheduled for real);
        None when fewer than ``min_steps``. An arrival or a short KV pool ends it sooner."""
        running = self.running
        if self._static or self.waiting or not running \
                or len(running) > self.config.max_num_batched_tokens:
            return None
        for r in running:
            c = r.num_computed_tokens
            if c < r.num_prompt_tokens or r.num_tokens - c != 1:  # _is_decode, inline
                return None
        num_steps = min(r.max_tokens - r.num_output_tokens for r in running) - 1
        if num_steps < min_steps:
            return None
        # A decode row takes a block when its computed tokens reach its table's end
        # (_schedule_decodes): at step s = table end - computed tokens, then every block_size
        # steps, in running order. (A reserved table holds every token: it never does.)
        bs = self.bm.block_size
        crossings: dict[int, list[Request]] = {}
        for r in running:
            s = len(r.block_table) * bs - r.num_computed_tokens
            while s < num_steps:
                if s >= 0:
                    crossings.setdefault(s, []).append(r)
                s += bs
        n = len(running)
        # A copy: the stretch's rows stay its own while the scheduler's list moves on.
        sched = SchedulerOutput(list(running), [1] * n, n, 0, self.config.max_num_batched_tokens)
        return DecodeStretch(sched, num_steps, self.bm, crossings)

    # ---- the per-iteration decision ---------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        step = _Step()
        if self._static and not self.running:
            self._admit_static_batch(step, now)
        budget, prefilling = self._schedule_decodes(step, budget)
        num_decodes = len(step.sched)
        budget = self._schedule_chunks(prefilling, step, budget)
        # 3. Admissions (continuous only), unless this step had to preempt.
        if not self._static and not step.preempted:
            budget = self._admit(step, budget, now)
        return self._output(step, budget, num_decodes)

    def _schedule_decodes(self, step: _Step, budget: int) -> tuple[int, list[Request]]:
        """1. Running decodes, oldest first. A decode needs a new block only when it crosses a
        block boundary; if the pool is dry, preempt until it fits. With speculative decoding
        a decode also verifies its draft tokens: 1 + drafts rows, as the budget and KV allow.
        Returns the budget left and the running requests with prompt left to compute (those
        after the budget ran out are not classified: they get no tokens this step)."""
        bm = self.bm
        sched = step.sched
        running = self.running
        block_size = bm.block_size
        prefilling: list[Request] = []
        i = 0
        n = len(running)
        while i < n and budget > 0:
            req = running[i]
            i += 1
            c = req.num_computed_tokens
            # A decode row: one known token left to compute, after the prompt (_is_decode,
            # inline: this loop visits every running request every step).
            if c < req.num_prompt_tokens or req.num_prompt_tokens + req.num_output_tokens - c != 1:
                prefilling.append(req)
                continue
            if req.spec_token_ids:
                d = self._schedule_drafts(req, c, budget, step)
                if d:
                    sched[req] = 1 + d
                    budget -= 1 + d
                    continue
            if c >= len(req.block_table) * block_size and not bm.allocate(req, c + 1):
                i, budget = self._make_room_for_decode(req, i, budget, step)
                n = len(running)
                if req.status != RequestStatus.RUNNING:
                    continue  # req itself was the victim
            sched[req] = 1
            budget -= 1
        return budget, prefilling

    def _schedule_chunks(self, prefilling: list[Request], step: _Step, budget: int) -> int:
        """2. Unfinished prefill chunks of running requests (chunked prefill, static batches).
        A victim preempted here may have been given tokens already this step: take them back.
        Returns the budget left."""
        cfg = self.config
        bm = self.bm
        sched = step.sched
        for req in prefilling:
            if budget <= 0:
                break
            if req.status != RequestStatus.RUNNING:
                continue  # preempted above
            n = req.num_tokens - req.num_computed_tokens
            if n > budget:
                if not cfg.chunked_prefill:
                    continue  # wait for an iteration with room for the whole prompt
                n = budget
            fits = True
            while not bm.allocate(req, req.num_computed_tokens + n):
                victim, _, taken, was_decode = self._preempt(step)
                budget += taken
                step.num_decodes_taken += was_decode
                if victim is req:
                    fits = False
                    break
            if fits:
                sched[req] = n
                budget -= n
                if self._caching:
                    bm.register_full_blocks(req, req.num_computed_tokens + n)
        return budget

    def _schedule_drafts(self, req: Request, c: int, budget: int, step: _Step) -> int:
        """Speculative decoding: keep as many of ``req``'s draft tokens as the token budget
        leaves room for beside its own row, with KV slots for all of them. Returns the drafts
        kept (``req.spec_token_ids`` trimmed to them); 0 when none fit, and then the request
        decodes one row as usual. Drafts never preempt: a guess is not worth another request's
        KV."""
        spec = req.spec_token_ids
        d = min(len(spec), budget - 1)
        if d > 0 and not self.bm.allocate(req, c + 1 + d):
            d = 0
        if d < len(spec):
            req.spec_token_ids = spec[:d]
        if d:
            step.num_drafts += 1
            step.num_draft_tokens += d
        return d

    def _make_room_for_decode(
        self, req: Request, i: int, budget: int, step: _Step
    ) -> tuple[int, int]:
        """Preempt until ``req``'s next token has a KV slot, or ``req`` itself is the victim.
        Returns the loop index and budget, adjusted for victims before ``i`` (priority only:
        under fcfs victims come from the end of ``running``, after ``req``, with no tokens).
        A victim's decode is already out of ``sched`` before the decodes are counted."""
        c = req.num_computed_tokens
        while True:
            victim, idx, taken, _ = self._preempt(step)
            if idx < i:
                i -= 1
            budget += taken
            if victim is req or self.bm.allocate(req, c + 1):
                return i, budget

    # ---- admission --------------------------------------------------------------------------
    def _lookup(self, req: Request) -> list[int]:
        """Prefix-cache hit blocks for a request about to start its prefill (none for one whose
        KV waits in the CPU pool, and none without prefix caching)."""
        if not self._caching or req.status == RequestStatus.SWAPPED:
            return []
        return self.bm.lookup_prefix(req)

    def _start(self, req: Request, now: float, num_cached: int, step: _Step) -> None:
        """Move the head of the queue to ``running``; a request starting its prefill begins
        after ``num_cached`` prefix-cached tokens."""
        self.waiting.popleft()
        if self._caching and req.status != RequestStatus.SWAPPED:
            if req.num_preemptions > 0:
                # As vLLM's PrefixCacheStats.record(preempted=...): a request resumed after a
                # recompute preemption may find its own blocks cached, but its prompt was
                # computed; counted apart, out of the hit rate and its per-request figure.
                step.num_preempted_queried_tokens += req.num_tokens
                step.num_preempted_cached_tokens += num_cached
            else:
                step.num_queried_tokens += req.num_tokens
                step.num_cached_tokens += num_cached
                req.num_cached_tokens = num_cached
            req.num_computed_at_admission = num_cached
            req.num_computed_tokens = num_cached
        req.status = RequestStatus.RUNNING
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
        self.running.append(req)

    def _admit(self, step: _Step, budget: int, now: float) -> int:
        """Continuous batching: start waiting requests, head first, while the budget, sequence
        slots and KV blocks allow. Returns the budget left."""
        cfg = self.config
        bm = self.bm
        waiting = self.waiting
        running = self.running
        sched = step.sched
        preempted = step.preempted
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            if preempted and req in preempted:
                break  # preempted by a priority admission this step: not back before the next
            # A swapped-out request resumes after its computed tokens; any other starts after
            # its prefix-cache hit (0 tokens without caching: a preempted one recomputes).
            swapped = req.status == RequestStatus.SWAPPED
            hit = self._lookup(req)
            c = req.num_computed_tokens if swapped else len(hit) * bm.block_size
            n = req.num_tokens - c
            if n > budget:
                if not cfg.chunked_prefill:
                    break  # first come, first served: the head waits for room
                n = budget
            if swapped:
                ok = self._swap_in_blocks(req, c + n, step)
            else:
                ok = bm.allocate_prefix(req, hit, c + n)
            if not ok:
                freed = self._preempt_for(req, step) if self._priority else None
                if freed is None:
                    break
                budget += freed
                continue  # try again (and look up again: the victim's blocks may be cached)
            self._start(req, now, c, step)
            sched[req] = n
            budget -= n
            if self._caching:  # as vLLM V1: findable by the admissions after it in this step
                bm.register_full_blocks(req, c + n)
            # Resumed from swap, or cached up to its last token: a decode after the prefills.
            if _is_decode(req):
                step.late_decodes = True
        return budget

    def _admit_static_batch(self, step: _Step, now: float) -> None:
        """Static batching: fill every slot the KV pool allows for the batch's prompts, then
        close the batch. The prompts' blocks are promised now and allocated as they prefill
        (paged), or reserved whole now (reserved)."""
        bm = self.bm
        waiting = self.waiting
        committed = 0  # blocks promised to admitted prompts, not yet allocated
        while waiting and len(self.running) < self.config.max_num_seqs:
            req = waiting[0]
            if req.status == RequestStatus.SWAPPED:
                need = bm.blocks_needed(req, req.num_tokens)
                if committed + need > bm.num_free_blocks:
                    break
                ok = self._swap_in_blocks(req, req.num_computed_tokens, step)
                assert ok
                committed += need - len(req.block_table)
                self._start(req, now, req.num_computed_tokens, step)
                continue
            hit = self._lookup(req)
            c = len(hit) * bm.block_size
            need = bm.admission_cost(req, hit, req.num_tokens)
            if committed + need > bm.num_free_blocks:
                break
            before = bm.num_free_blocks
            # Take the hit blocks now (reserved: the whole reservation); the prompt's other
            # blocks are allocated as it prefills.
            ok = bm.allocate_prefix(req, hit, req.num_tokens if bm.reserved else c)
            assert ok
            committed += need - (before - bm.num_free_blocks)
            self._start(req, now, c, step)

    # ---- the output -------------------------------------------------------------------------
    def _output(self, step: _Step, budget: int, num_decodes: int) -> SchedulerOutput:
        """Release the CPU blocks swapped in this step, and build the output decodes first.
        ``num_decodes`` is the decodes scheduled in phase 1, before any was taken back."""
        sched = step.sched
        if step.swapped_in:
            cpu = self.cpu_bm
            assert cpu is not None, "only swap preemption swaps in"
            for req in step.swapped_in:
                cpu.free_blocks(req.cpu_block_table)
                req.cpu_block_table = []
        if step.late_decodes:
            # An admitted decode (resumed from swap, or cached up to its last token) follows
            # the prefill chunks in ``sched``: move the decodes to the front.
            decodes = [r for r in sched if _is_decode(r)]
            reqs = decodes + [r for r in sched if not _is_decode(r)]
            nums = [sched[r] for r in reqs]
            num_decodes = len(decodes)
        else:
            reqs = list(sched)
            nums = list(sched.values())
            num_decodes -= step.num_decodes_taken
        token_budget = self.config.max_num_batched_tokens
        drafts = step.num_draft_tokens
        return SchedulerOutput(
            scheduled_reqs=reqs,
            num_scheduled_tokens=nums,
            num_decode_reqs=num_decodes,
            # Every token scheduled came out of the budget, and every one taken back went in.
            num_prefill_tokens=token_budget - budget - num_decodes - drafts,
            token_budget=token_budget,
            num_drafts=step.num_drafts,
            num_draft_tokens=drafts,
            preempted=step.preempted,
            swap_out=step.swap_out,
            swap_in=step.swap_in,
            num_cached_tokens=step.num_cached_tokens,
            num_prefix_queried_tokens=step.num_queried_tokens,
            num_preempted_cached_tokens=step.num_preempted_cached_tokens,
            num_preempted_queried_tokens=step.num_preempted_queried_tokens,
        )
