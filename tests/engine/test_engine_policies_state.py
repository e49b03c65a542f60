"""Block accounting with swap preemption, priority scheduling and prefix caching, under a
hypothesis state machine.

Random ``add`` / ``abort`` / ``step`` sequences drive the real Engine over every combination of
static/continuous batching, chunked prefill on/off, paged/reserved allocation,
recompute/swap preemption, fcfs/priority queues and prefix caching on/off, with small GPU and
CPU pools so that preemption, swapping, eviction and cache hits are frequent.

The executor is a *shadow KV cache*: it stores, for every (block, slot), the token id whose
KV was written there; it applies each step's swap-out copies, then its swap-in copies, then
the step's writes (all of them before any read, as the model runner does), then
checks that every scheduled request's cached context (``num_computed_tokens`` tokens, read
through its block table: prefix-cache hits and swapped-in blocks included) holds exactly that
request's tokens, and writes the new ones. A block evicted or rewritten while referenced, a
swap copy in the wrong order, or a cache hit on the wrong content fails this check.

Invariants after every operation: both pools conserved (every block free, held by live
requests with matching reference counts, or cached and unreferenced); waiting requests hold
no GPU blocks; exactly the SWAPPED requests hold CPU blocks; budgets respected; every request
ends exactly once (finished, aborted or rejected), and a drained engine gives every block back.

``CBBENCH_POLICY_EXAMPLES=10000 pytest tests/engine/test_engine_policies_state.py`` (or the thorough
hypothesis profile) runs a long campaign; the default is bounded for CI.
"""

from __future__ import annotations

import os
import sys

from helpers import examples
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from cbbench.engine.core.clock import VirtualClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.request import Request, RequestStatus
from cbbench.engine.core.scheduler import SchedulerConfig
from cbbench.engine.core.scheduler_output import ExecutorOutput, SchedulerOutput

VOCAB = 3  # tiny: equal blocks (hence cache hits) are common
# Shared prompt heads, so requests in a group find each other's blocks.
GROUP_PREFIXES = [
    [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0],
    [2, 2, 1, 1, 0, 0, 2, 2, 1, 1, 0, 0, 2, 2, 1, 1],
    [1] * 16,
    [],
]
MAX_DRAIN_STEPS = 10_000
WAITING = RequestStatus.WAITING
EXAMPLES = int(os.environ.get("CBBENCH_POLICY_EXAMPLES", examples(600)))


def sample_token(req: Request) -> int:
    """A deterministic 'model': the next token depends only on the request's tokens."""
    ids = req.token_ids_slice(0, req.num_tokens)
    return (sum(ids[-3:]) * 7 + len(ids)) % VOCAB


class ShadowKVExecutor:
    """Tracks which token's KV every cache slot holds, on the GPU and in the CPU pool."""

    def __init__(self, engine_ref: list[Engine]) -> None:
        self.engine_ref = engine_ref
        self.gpu: dict[tuple[int, int], int] = {}
        self.cpu: dict[tuple[int, int], int] = {}

    def _copy(self, src: dict, dst: dict, src_block: int, dst_block: int, bs: int) -> None:
        for s in range(bs):
            if (src_block, s) in src:
                dst[(dst_block, s)] = src[(src_block, s)]
            else:
                dst.pop((dst_block, s), None)

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        engine = self.engine_ref[0]
        cfg = engine.config.scheduler
        bs = engine.config.block_size
        # Swap-outs first, then swap-ins: a GPU block freed by one may receive the other.
        for g, c in sched.swap_out:
            self._copy(self.gpu, self.cpu, g, c, bs)
        for c, g in sched.swap_in:
            self._copy(self.cpu, self.gpu, c, g, bs)

        reqs, nums = sched.scheduled_reqs, sched.num_scheduled_tokens
        assert sum(nums) == sched.total_tokens <= cfg.max_num_batched_tokens
        assert len(reqs) <= cfg.max_num_seqs
        assert len(set(map(id, reqs))) == len(reqs)
        assert not set(map(id, reqs)) & set(map(id, sched.preempted))
        nd = sched.num_decode_reqs
        # The step's writes land before any read, as the model runner writes the whole batch's
        # new K/V in each layer before that layer's attention (kernels/backend.py: write_kv,
        # then forward): a request may read KV another writes in the same step (V1's same-step
        # prefix hits), even one ordered after it (decodes come first in the batch). A slot is
        # written once a step: a block two requests share is full and never rewritten.
        written: set[tuple[int, int]] = set()
        for req, n in zip(reqs, nums, strict=True):
            c, table = req.num_computed_tokens, req.block_table
            ids = req.token_ids_slice(0, c + n)
            for p in range(c, c + n):
                slot = (table[p // bs], p % bs)
                assert slot not in written, f"{req!r}: slot {slot} written twice in one step"
                written.add(slot)
                self.gpu[slot] = ids[p]
        sampled: list[int | None] = []
        for i, (req, n) in enumerate(zip(reqs, nums, strict=True)):
            assert req.status == RequestStatus.RUNNING
            assert not req.cpu_block_table
            c = req.num_computed_tokens
            assert 1 <= n <= req.num_tokens - c
            is_decode = c >= req.num_prompt_tokens and req.num_tokens - c == 1
            assert is_decode == (i < nd), (i, nd, req)
            if not cfg.chunked_prefill:
                assert n == req.num_tokens - c
            table = req.block_table
            assert len(table) * bs >= c + n
            ids = req.token_ids_slice(0, c + n)
            for p in range(c):  # the cached context is exactly this request's tokens
                got = self.gpu.get((table[p // bs], p % bs))
                assert got == ids[p], f"{req!r}: slot of token {p} holds {got}, not {ids[p]}"
            sampled.append(sample_token(req) if c + n == req.num_tokens else None)
        return ExecutorOutput(sampled_token_ids=sampled, duration_s=1e-3)


_request = st.tuples(
    st.integers(0, len(GROUP_PREFIXES) - 1),  # group
    st.integers(0, 16),  # length of the group's head used
    st.lists(st.integers(0, VOCAB - 1), max_size=12),  # own tail
    st.integers(1, 24),  # max_tokens
    st.integers(0, 2),  # priority
)


class PolicyMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(["continuous", "static"]),
        chunked=st.booleans(),
        allocation=st.sampled_from(["paged", "reserved"]),
        preemption=st.sampled_from(["recompute", "swap", "swap"]),  # swap needs more cover,
        queue_policy=st.sampled_from(["fcfs", "priority"]),
        caching=st.booleans(),
        block_size=st.sampled_from([1, 2, 4]),
        pool_tokens=st.integers(8, 32),
        cpu_blocks=st.integers(0, 24),
        budget=st.integers(1, 48),
        max_num_seqs=st.integers(2, 8),
        max_model_len=st.integers(8, 64),
        preload=st.lists(_request, min_size=2, max_size=8),  # load from the first step
    )
    def setup(
        self, policy, chunked, allocation, preemption, queue_policy, caching, block_size,
        pool_tokens, cpu_blocks, budget, max_num_seqs, max_model_len, preload,
    ):  # fmt: skip
        self.num_blocks = max(1, pool_tokens // block_size)
        cfg = SchedulerConfig(
            max_model_len=max_model_len, batching=policy, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget, chunked_prefill=chunked,
            preemption_mode=preemption, queue_policy=queue_policy,
        )  # fmt: skip
        ref: list[Engine] = []
        self.executor = ShadowKVExecutor(ref)
        self.engine = Engine(
            EngineConfig(
                cfg, self.num_blocks, block_size, allocation,
                num_cpu_blocks=cpu_blocks if preemption == "swap" else 0,
                enable_prefix_caching=caching,
            ),
            self.executor,
            VirtualClock(),
        )  # fmt: skip
        ref.append(self.engine)
        self.reqs: list[Request] = []
        self.ends: dict[int, int] = {}  # request id -> times it ended
        self.add(preload)

    def _end(self, req: Request) -> None:
        self.ends[req.request_id] = self.ends.get(req.request_id, 0) + 1
        assert self.ends[req.request_id] == 1, f"{req!r} ended twice"

    # ---- operations -------------------------------------------------------------------------
    @rule(batch=st.lists(_request, min_size=1, max_size=4))
    def add(self, batch):
        for group, head, tail, max_tokens, priority in batch:
            ids = GROUP_PREFIXES[group][:head] + tail or [0]
            req = Request(
                len(self.reqs), len(ids), max_tokens, arrival_time=self.engine.clock.now(),
                prompt_token_ids=ids, priority=priority,
            )  # fmt: skip
            self.reqs.append(req)
            if self.engine.add_request(req) is not None:
                assert req.status == RequestStatus.REJECTED
                self._end(req)

    @rule(pick=st.integers(0, 1 << 16))
    def abort(self, pick):
        live = [r for r in self.reqs if not r.status.is_done]
        if not live:
            return
        req = live[pick % len(live)]
        self.engine.abort_request(req)
        assert req.status == RequestStatus.ABORTED
        assert not req.block_table and not req.cpu_block_table
        self._end(req)

    @rule()
    def step(self):
        out = self.engine.step()
        if out is not None:
            self._observe(out)

    def _observe(self, out) -> None:
        rec = out.record
        assert rec.num_prefill_tokens + rec.num_decode_tokens <= rec.token_budget
        assert rec.num_running <= self.engine.config.scheduler.max_num_seqs
        assert rec.kv_blocks_used <= self.num_blocks
        assert rec.num_cached_tokens <= rec.num_prefix_queried_tokens
        for name, happened in (
            ("preemption", rec.num_preempted),
            ("swap out", rec.num_swapped_out_blocks),
            ("swap in", rec.num_swapped_in_blocks),
            ("prefix cache hit", rec.num_cached_tokens),
        ):
            if happened:
                event(name)
        for req in out.finished:
            assert req.status == RequestStatus.FINISHED
            assert req.num_output_tokens == req.max_tokens
            assert len(req.output_token_ids) == req.max_tokens
            self._end(req)

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def pools_are_conserved(self):
        sched = self.engine.scheduler
        running, waiting = list(sched.running), list(sched.waiting)
        live = running + waiting
        assert len({id(r) for r in live}) == len(live)
        self.engine.block_manager.check_invariants(live)
        cpu = self.engine.cpu_block_manager
        if cpu is not None:
            cpu.check_invariants(live, cpu=True)
        for r in waiting:
            assert r.status in (WAITING, RequestStatus.PREEMPTED, RequestStatus.SWAPPED)
            assert not r.block_table, f"{r!r} waits holding GPU blocks"
            assert bool(r.cpu_block_table) == (r.status == RequestStatus.SWAPPED)
            if r.status == RequestStatus.SWAPPED:
                bs = self.engine.config.block_size
                assert len(r.cpu_block_table) * bs >= r.num_computed_tokens
            else:
                assert r.num_computed_tokens == 0
        for r in running:
            assert r.status == RequestStatus.RUNNING and not r.cpu_block_table
        assert len(running) <= self.engine.config.scheduler.max_num_seqs
        for r in self.reqs:
            if r.status.is_done:
                assert not r.block_table and not r.cpu_block_table

    def teardown(self):
        # Hypothesis calls teardown in a ``finally``: after a failed rule, let that failure
        # stand rather than mask it with the drain's.
        if not hasattr(self, "engine") or sys.exc_info()[0] is not None:
            return
        engine = self.engine
        for _ in range(MAX_DRAIN_STEPS):
            if not engine.has_unfinished():
                break
            out = engine.step()
            assert out is not None, "engine stalled with requests left"
            self._observe(out)
            self.pools_are_conserved()
        assert not engine.has_unfinished()
        for r in self.reqs:
            assert r.status.is_done and self.ends.get(r.request_id) == 1, r
            if r.status == RequestStatus.FINISHED:
                expected = []
                # Recompute, swap and cache hits never change what a request generates.
                probe = Request(
                    -1, r.num_prompt_tokens, r.max_tokens, prompt_token_ids=list(r.prompt_token_ids)
                )
                for _ in range(r.max_tokens):
                    probe.output_token_ids.append(sample_token(probe))
                    probe.num_output_tokens += 1
                    expected.append(probe.output_token_ids[-1])
                assert r.output_token_ids == expected
        bm = engine.block_manager
        assert bm.num_free_blocks == self.num_blocks
        if bm.enable_prefix_caching:
            assert all(rc == 0 for rc in bm.ref_counts)
        if engine.cpu_block_manager is not None:
            assert engine.cpu_block_manager.num_free_blocks == engine.cpu_block_manager.num_blocks


PolicyMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_policy_state_machine = PolicyMachine.TestCase
