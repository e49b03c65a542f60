"""The scheduler: once per iteration, decide ``{request: number of new tokens}``.

``continuous`` (iteration-level, Orca/vLLM): running decodes first, then unfinished prefill
chunks, then new admissions while the token budget, sequence slots and KV blocks allow. With
chunked prefill a long prompt is split across iterations so decodes keep moving (Sarathi-Serve's
stall-free rule). When KV runs out the newest running request is preempted by recompute: its
blocks are freed and it goes back to the front of the waiting queue.

``static``: a batch is admitted only when nothing is running, and runs until its last member
finishes; finished members leave idle slots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .request import Request, RequestStatus
from .scheduler_output import SchedulerOutput

POLICIES = ("continuous", "static")
# vLLM's defaults when serving: 256 sequences; a 2048-token budget with chunked prefill, and
# without chunking a budget that admits any prompt the model takes.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_CHUNKED_BUDGET = 2048


def default_max_num_batched_tokens(chunked_prefill: bool, max_model_len: int) -> int:
    if chunked_prefill:
        return DEFAULT_CHUNKED_BUDGET
    return max(max_model_len, DEFAULT_CHUNKED_BUDGET)


@dataclass(frozen=True)
class SchedulerConfig:
    max_model_len: int
    policy: str = "continuous"
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_CHUNKED_BUDGET
    chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown scheduler {self.policy!r}: use {', '.join(POLICIES)}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_model_len must be >= 1")


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.bm = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the newest
        self._static = config.policy == "static"

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

    def add_request(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Take an aborted request out of whichever queue holds it and free its blocks."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.bm.free(req)

    def drop_finished(self) -> None:
        self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- the per-iteration decision ---------------------------------------------------------
    def _preempt_newest(self, sched: dict[Request, int], preempted: list[Request]) -> tuple[Request, int]:
        """Preempt (recompute) the newest running request; return it and the tokens it had
        been given this step (0 when it had none), so the caller can take them back."""
        victim = self.running.pop()
        self.bm.free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        preempted.append(victim)
        return victim, sched.pop(victim, 0)

    def schedule(self, now: float) -> SchedulerOutput:
        cfg = self.config
        bm = self.bm
        budget = cfg.max_num_batched_tokens
        sched: dict[Request, int] = {}
        preempted: list[Request] = []
        running = self.running

        if self._static and not running:
            self._admit_static_batch(now)
            running = self.running

        # 1. Running decodes, oldest first. A decode needs a new block only when it crosses a
        # block boundary; if the pool is dry, preempt the newest until it fits.
        block_size = bm.block_size
        prefilling: list[Request] = []
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            i += 1
            c = req.num_computed_tokens
            if c < req.num_prompt_tokens or req.num_tokens - c != 1:
                prefilling.append(req)
                continue
            if c >= len(req.block_table) * block_size:
                # Victims come from the end of ``running``, after req: none has tokens yet.
                while not bm.allocate(req, c + 1):
                    if self._preempt_newest(sched, preempted)[0] is req:
                        break
                if req.status != RequestStatus.RUNNING:
                    break  # req was the newest and is now preempted: nothing after it
            sched[req] = 1
            budget -= 1
        num_decodes = len(sched)
        # Requests after the budget ran out were not classified; they get no tokens this step.

        # 2. Unfinished prefill chunks of running requests (chunked prefill, static batches).
        # A victim preempted here may be a decode given a token in step 1: take it back.
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
                victim, taken = self._preempt_newest(sched, preempted)
                if taken:
                    budget += taken
                    num_decodes -= 1
                if victim is req:
                    fits = False
                    break
            if fits:
                sched[req] = n
                budget -= n

        # 3. Admissions (continuous only), in arrival order, unless this step had to preempt.
        if not self._static and not preempted:
            budget = self._admit(sched, budget, now)

        reqs = list(sched)
        return SchedulerOutput(
            scheduled_reqs=reqs,
            num_scheduled_tokens=list(sched.values()),
            num_decode_reqs=num_decodes,
            num_prefill_tokens=cfg.max_num_batched_tokens - budget - num_decodes,
            token_budget=cfg.max_num_batched_tokens,
            preempted=preempted,
        )

    def _admit(self, sched: dict[Request, int], budget: int, now: float) -> int:
        cfg = self.config
        waiting = self.waiting
        running = self.running
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            n = req.num_tokens - req.num_computed_tokens
            if n > budget:
                if not cfg.chunked_prefill:
                    break  # first come, first served: the head waits for room
                n = budget
            if not self.bm.allocate(req, req.num_computed_tokens + n):
                break
            waiting.popleft()
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            running.append(req)
            sched[req] = n
            budget -= n
        return budget

    def _admit_static_batch(self, now: float) -> None:
        """Fill every slot the KV pool allows for the batch's prompts, then close the batch."""
        bm = self.bm
        waiting = self.waiting
        committed = 0
        while waiting and len(self.running) < self.config.max_num_seqs:
            req = waiting[0]
            need = bm.blocks_needed(req, req.num_tokens)
            if committed + need > bm.num_free_blocks:
                break
            if bm.reserved:
                bm.allocate(req, req.num_tokens)
            else:
                committed += need
            waiting.popleft()
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            self.running.append(req)
