"""The scheduler, in the style of vLLM v1's scheduler tests: create Requests, step the real
Engine (schedule -> a trivial executor that checks every plan against the scheduler's rules ->
the engine's own postprocess) and compare each plan with numbers computed by hand from the rules
in engine/core/scheduler.py (decodes, then running prefill chunks, then admissions; recompute
preemption of the newest; rejection at arrival).

A hypothesis property then runs random workloads and configurations to completion through the
real Engine with a trivial executor and checks the invariants on every iteration.
"""

from __future__ import annotations

import re

import pytest
from helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbbench.engine.core.clock import VirtualClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.feed import run_until_done
from cbbench.engine.core.request import Request, RequestStatus
from cbbench.engine.core.scheduler import Scheduler, SchedulerConfig
from cbbench.engine.core.scheduler_output import ExecutorOutput, SchedulerOutput


# ---- helpers --------------------------------------------------------------------------------
def make_engine(
    num_blocks: int = 1000,
    block_size: int = 4,
    allocation: str = "paged",
    max_model_len: int = 4096,
    **cfg,
) -> Engine:
    ex = _FakeExecutor()
    eng = Engine(
        EngineConfig(SchedulerConfig(max_model_len=max_model_len, **cfg), num_blocks, block_size,
                     allocation),
        ex,
        VirtualClock(),
    )  # fmt: skip
    ex.engine = eng  # checks every plan before it runs
    return eng


def step(eng: Engine, now: float | None = None) -> SchedulerOutput:
    """One engine iteration (at ``now`` when given); the plan it ran."""
    if now is not None:
        eng.clock.advance_to(now)
    out = eng.step()
    assert out is not None
    return out.scheduled


def plan(out: SchedulerOutput) -> list[tuple[int, int]]:
    return [(r.request_id, n) for r, n in zip(out.scheduled_reqs, out.num_scheduled_tokens)]


def check_output(s: Scheduler, out: SchedulerOutput) -> None:
    cfg = s.config
    assert out.total_tokens <= cfg.max_num_batched_tokens
    assert sum(out.num_scheduled_tokens) == out.total_tokens
    assert len(out.scheduled_reqs) <= cfg.max_num_seqs
    assert len(s.running) <= cfg.max_num_seqs
    assert len(set(map(id, out.scheduled_reqs))) == len(out.scheduled_reqs)
    assert out.token_budget == cfg.max_num_batched_tokens
    nd = out.num_decode_reqs
    for i, (req, n) in enumerate(zip(out.scheduled_reqs, out.num_scheduled_tokens)):
        assert req.status == RequestStatus.RUNNING
        assert 1 <= n <= req.num_tokens - req.num_computed_tokens
        is_decode = (
            req.num_computed_tokens >= req.num_prompt_tokens
            and req.num_tokens - req.num_computed_tokens == 1
        )
        # Decodes first (exactly num_decode_reqs of them), then prefill chunks.
        assert is_decode == (i < nd), (i, nd, req)
        if not cfg.chunked_prefill:
            assert n == req.num_tokens - req.num_computed_tokens, "a chunk with chunking off"
        # The KV slots for every token computed this step exist.
        assert len(req.block_table) * s.bm.block_size >= req.num_computed_tokens + n
    for req in out.preempted:
        assert req not in out.scheduled_reqs
        assert req.block_table == []
        assert req.num_computed_tokens == 0
    s.bm.check_invariants(list(s.running) + list(s.waiting))


# ---- budgets and order ----------------------------------------------------------------------
def test_token_budget_and_max_num_seqs_hand_computed():
    eng = make_engine(max_num_batched_tokens=16, max_num_seqs=3)
    s = eng.scheduler
    reqs = [Request(i, 10, 5) for i in range(5)]
    for r in reqs:
        eng.add_request(r)
    out = step(eng)
    # A takes 10, B the 6 left as a chunk; the budget is spent, so C waits.
    assert plan(out) == [(0, 10), (1, 6)]
    assert out.num_decode_reqs == 0 and out.num_prefill_tokens == 16
    out = step(eng)
    # A decodes (1), B finishes its prompt (4), C is admitted whole (10); D would fit the one
    # token left but all 3 sequence slots are taken.
    assert plan(out) == [(0, 1), (1, 4), (2, 10)]
    assert out.num_decode_reqs == 1 and out.num_prefill_tokens == 14
    assert [r.request_id for r in s.running] == [0, 1, 2]
    assert [r.request_id for r in s.waiting] == [3, 4]


def test_newer_decode_comes_before_older_prefill():
    # Static, chunking off: B's prompt does not fit what A left of the budget, C's does; in the
    # next iteration C (newer) decodes and is listed before B (older, still prefilling).
    eng = make_engine(max_num_batched_tokens=36, batching="static", chunked_prefill=False)
    a, b, c = Request(0, 30, 5), Request(1, 10, 5), Request(2, 4, 5)
    for r in (a, b, c):
        eng.add_request(r)
    out = step(eng)
    assert plan(out) == [(0, 30), (2, 4)]
    assert out.num_decode_reqs == 0 and out.num_prefill_reqs == 2
    out = step(eng)
    assert plan(out) == [(0, 1), (2, 1), (1, 10)]
    assert out.num_decode_reqs == 2
    assert out.num_prefill_reqs == 1 and out.num_prefill_tokens == 10
    assert out.total_tokens == 12


def test_chunked_prefill_splits_a_long_prompt_while_decodes_advance():
    eng = make_engine(max_num_batched_tokens=16)
    d = Request(0, 4, 10)
    eng.add_request(d)
    assert plan(step(eng)) == [(0, 4)]  # d's prompt; it now holds one output token
    long = Request(1, 40, 2)
    eng.add_request(long)
    # Budget 16, one decode: the prompt of 40 goes in as 15 + 15 + 10.
    chunks = []
    for expected_out in (2, 3, 4):
        out = step(eng)
        assert out.scheduled_reqs[0] is d and out.num_scheduled_tokens[0] == 1
        assert out.num_decode_reqs == 1
        assert d.num_output_tokens == expected_out  # the decode advanced this iteration
        chunks.append(out.num_scheduled_tokens[1])
    assert chunks == [15, 15, 10]
    assert long.num_computed_tokens == 40 and long.num_output_tokens == 1
    out = step(eng)
    assert plan(out) == [(0, 1), (1, 1)] and out.num_decode_reqs == 2


def test_without_chunking_a_prompt_waits_for_a_whole_prompt_iteration():
    eng = make_engine(max_num_batched_tokens=16, chunked_prefill=False)
    d1, d2 = Request(0, 4, 3), Request(1, 4, 3)
    eng.add_request(d1)
    eng.add_request(d2)
    assert plan(step(eng)) == [(0, 4), (1, 4)]
    long = Request(2, 15, 2)
    eng.add_request(long)
    # Two decodes leave 14 tokens: the 15-token prompt waits.
    assert plan(step(eng)) == [(0, 1), (1, 1)]
    assert long.status == RequestStatus.WAITING and long.num_computed_tokens == 0
    assert plan(step(eng)) == [(0, 1), (1, 1)]  # d1 and d2 reach 3 tokens and finish
    assert d1.status == d2.status == RequestStatus.FINISHED
    out = step(eng)
    assert plan(out) == [(2, 15)]
    assert out.num_prefill_tokens == 15

    # The same with chunking on: the prompt starts at once with the 14 tokens left.
    eng = make_engine(max_num_batched_tokens=16, chunked_prefill=True)
    d1, d2 = Request(0, 4, 3), Request(1, 4, 3)
    eng.add_request(d1)
    eng.add_request(d2)
    step(eng)
    eng.add_request(Request(2, 15, 2))
    assert plan(step(eng)) == [(0, 1), (1, 1), (2, 14)]


# ---- static vs continuous -------------------------------------------------------------------
def _static_vs_continuous(policy: str) -> tuple[list[list[tuple[int, int]]], list[int]]:
    eng = make_engine(max_num_batched_tokens=64, max_num_seqs=2, batching=policy)
    s = eng.scheduler
    a, b, c = Request(0, 4, 2), Request(1, 4, 5), Request(2, 4, 1)
    for r in (a, b, c):
        eng.add_request(r)
    plans, running = [], []
    for _ in range(20):
        if not s.num_unfinished:
            break
        out = step(eng)
        plans.append(plan(out))
        running.append(len(s.running))
    assert all(r.num_output_tokens == r.max_tokens for r in (a, b, c))
    return plans, running


def test_static_admits_a_new_batch_only_when_every_member_finished():
    plans, running = _static_vs_continuous("static")
    assert plans == [
        [(0, 4), (1, 4)],  # batch {a, b}; c waits for a slot
        [(0, 1), (1, 1)],  # a finishes
        [(1, 1)],  # a's slot stays idle: c is not admitted
        [(1, 1)],
        [(1, 1)],  # b finishes
        [(2, 4)],  # only now the next batch: {c}
    ]
    assert running[2:5] == [1, 1, 0]  # one idle slot while b runs on alone


def test_continuous_admits_as_soon_as_a_slot_frees():
    plans, _ = _static_vs_continuous("continuous")
    assert plans == [
        [(0, 4), (1, 4)],
        [(0, 1), (1, 1)],  # a finishes
        [(1, 1), (2, 4)],  # c takes a's slot at once (and finishes: max_tokens 1)
        [(1, 1)],
        [(1, 1)],
    ]


def test_static_admits_nothing_while_a_batch_runs():
    eng = make_engine(max_num_batched_tokens=64, max_num_seqs=8, batching="static")
    s = eng.scheduler
    first = [Request(i, 4, 3) for i in range(2)]
    for r in first:
        eng.add_request(r)
    step(eng)
    late = Request(9, 4, 3)
    eng.add_request(late)
    for _ in range(2):
        out = step(eng)
        assert late not in out.scheduled_reqs
        assert late.status == RequestStatus.WAITING and late.first_scheduled_time is None
    assert not s.running  # the batch finished
    out = step(eng, now=5.0)
    assert plan(out) == [(9, 4)]
    assert late.first_scheduled_time == 5.0


# ---- preemption -----------------------------------------------------------------------------
def test_recompute_preemption_of_the_newest_under_a_tiny_pool():
    # 4 blocks of 4 tokens. a and b (prompt 4, 8 outputs) each need 3 blocks at most (11 KV
    # tokens): both fit alone, not together.
    eng = make_engine(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    s = eng.scheduler
    a, b = Request(0, 4, 8), Request(1, 4, 8)
    assert s.rejection_reason(a) is None
    eng.add_request(a)
    eng.add_request(b)
    assert plan(step(eng)) == [(0, 4), (1, 4)]  # one block each
    assert plan(step(eng)) == [(0, 1), (1, 1)]  # token 5 crosses a block: two each, pool dry
    assert s.bm.num_free_blocks == 0
    for _ in range(3):  # tokens 6..8 fit the second blocks
        assert plan(step(eng)) == [(0, 1), (1, 1)]
    assert a.num_computed_tokens == 8 and b.num_output_tokens == 5
    b_blocks = list(b.block_table)
    # a's 9th token needs a third block: b, the newest, is preempted by recompute.
    out = step(eng)
    assert plan(out) == [(0, 1)]
    assert out.preempted == [b]
    assert out.num_decode_reqs == 1 and out.num_prefill_tokens == 0
    assert b.status == RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.block_table == [] and b.num_output_tokens == 5  # outputs are kept
    assert s.waiting[0] is b  # the front of the queue
    assert set(a.block_table) & set(b_blocks)  # its blocks went back and a took one
    assert s.bm.num_used_blocks == 3
    s.bm.check_invariants([a, b])
    # b cannot come back (its 9 tokens need 3 blocks, 1 is free) until a finishes.
    for _ in range(2):
        out = step(eng)
        assert plan(out) == [(0, 1)]
    assert a.status == RequestStatus.FINISHED and a.num_output_tokens == 8
    # b recomputes prompt + its 5 outputs in one prefill, then decodes to the end.
    out = step(eng)
    assert plan(out) == [(1, 9)]
    assert b.status == RequestStatus.RUNNING and b.num_output_tokens == 6
    while s.num_unfinished:
        step(eng)
    assert b.num_output_tokens == 8 and b.num_preemptions == 1
    assert s.bm.num_free_blocks == 4


def test_preemption_during_a_prefill_takes_back_the_victims_decode_token():
    # Static, chunking off, budget 36, 12 blocks of 4: the batch {a, b, c} commits 8 + 3 + 1
    # prompt blocks. a (30) and c (4) prefill; b (10) waits for budget. Next step a and c
    # decode (c crosses into a 2nd block: 1 free), then b's prompt needs 3 blocks: c, the
    # newest, is preempted and its decode token is taken back.
    eng = make_engine(
        num_blocks=12, block_size=4, max_num_batched_tokens=36, batching="static",
        chunked_prefill=False,
    )
    s = eng.scheduler
    a, b, c = Request(0, 30, 3), Request(1, 10, 2), Request(2, 4, 4)
    for r in (a, b, c):
        eng.add_request(r)
    assert plan(step(eng)) == [(0, 30), (2, 4)]
    out = step(eng)
    assert out.preempted == [c]
    assert plan(out) == [(0, 1), (1, 10)]
    assert out.num_decode_reqs == 1 and out.num_prefill_tokens == 10 and out.total_tokens == 11
    assert c.num_preemptions == 1 and c.num_computed_tokens == 0 and c.num_output_tokens == 1
    assert s.waiting[0] is c
    step(eng)  # a and b finish
    assert a.status == b.status == RequestStatus.FINISHED
    assert plan(step(eng)) == [(2, 5)]  # recompute: prompt + 1 output
    while s.num_unfinished:
        step(eng)
    assert c.num_output_tokens == 4


# ---- rejection ------------------------------------------------------------------------------
def _engine(num_blocks=8, block_size=4, **cfg) -> Engine:
    return Engine(
        EngineConfig(SchedulerConfig(**cfg), num_blocks, block_size), _FakeExecutor(), VirtualClock()
    )


@pytest.mark.parametrize(
    ("cfg", "prompt", "max_tokens", "pattern"),
    [
        (dict(max_model_len=100), 90, 11, r"exceed the model's context of 100"),
        (dict(max_model_len=1000), 20, 20, r"needs 10 KV blocks but the whole pool has 8"),
        (
            dict(max_model_len=1000, max_num_batched_tokens=16, chunked_prefill=False),
            10,
            8,
            r"exceed max_num_batched_tokens \(16\) with chunked prefill off",
        ),
        (dict(max_model_len=1000), 4, 0, r"at least 1 token"),
    ],
)
def test_rejection_gives_a_reason_and_never_schedules(cfg, prompt, max_tokens, pattern):
    eng = _engine(**cfg)
    bad = Request(0, prompt, max_tokens)
    ok = Request(1, 4, 2)
    reason = eng.add_request(bad)
    assert reason is not None
    assert re.search(pattern, reason), reason
    assert bad.status == RequestStatus.REJECTED and bad.finish_reason == reason
    assert eng.rejected == [bad]
    assert eng.add_request(ok) is None
    seen = []
    while eng.has_unfinished():
        st_ = eng.step()
        seen.extend(st_.scheduled.scheduled_reqs)
    assert bad not in seen and bad.num_computed_tokens == 0 and not bad.token_times
    assert ok.num_output_tokens == 2


def test_rejection_boundaries_are_exact():
    eng = make_engine(num_blocks=4, block_size=4, max_model_len=20,
                      max_num_batched_tokens=16, chunked_prefill=False)
    s = eng.scheduler
    # prompt + output == max_model_len is fine; one more is not.
    assert s.rejection_reason(Request(0, 10, 7)) is None  # 16 KV tokens, 17 - 1 <= 16
    assert s.rejection_reason(Request(0, 10, 8)) is not None  # 18 - 1 > 16 budget
    # paged: the last output's KV is never written, so 17 tokens fit 4 blocks of 4.
    s2 = make_engine(num_blocks=4, block_size=4, max_model_len=100).scheduler
    assert s2.rejection_reason(Request(0, 10, 7)) is None
    assert s2.rejection_reason(Request(0, 10, 8)) is not None
    s3 = make_engine(num_blocks=4, block_size=4, max_model_len=17).scheduler
    assert s3.rejection_reason(Request(0, 10, 7)) is None
    assert "context of 17" in s3.rejection_reason(Request(0, 11, 7))


# ---- reserved vs paged ----------------------------------------------------------------------
def _max_concurrency(allocation: str) -> int:
    eng = Engine(
        EngineConfig(SchedulerConfig(max_model_len=1000, max_num_batched_tokens=256), 16, 4,
                     allocation),
        _FakeExecutor(),
        VirtualClock(),
    )
    reqs = [Request(i, 4, 12) for i in range(8)]  # reserved: 16 tokens = 4 blocks each
    run_until_done(eng, reqs)
    assert all(r.num_output_tokens == 12 for r in reqs)
    return max(rec.num_running for rec in eng.records)


def test_reserved_admits_fewer_concurrent_requests_than_paged():
    reserved = _max_concurrency("reserved")
    paged = _max_concurrency("paged")
    assert reserved == 4  # 16 blocks / 4 reserved each
    assert paged > reserved


# ---- property: random workloads to completion -----------------------------------------------
class _FakeExecutor:
    """Checks each scheduled batch against the engine's state, then takes 1 ms."""

    def __init__(self):
        self.engine: Engine | None = None
        self.prev_running: set[int] = set()
        self.new_batches_while_running = 0

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        if self.engine is not None:
            s = self.engine.scheduler
            check_output(s, sched)
            if s.config.batching == "static":
                now_running = {id(r) for r in s.running}
                if now_running - self.prev_running and self.prev_running:
                    self.new_batches_while_running += 1
            if s.bm.reserved:
                for r in s.running:
                    if r.block_table:
                        assert len(r.block_table) * s.bm.block_size >= r.max_total_tokens
        return ExecutorOutput(sampled_token_ids=None, duration_s=1e-3)


_workloads = st.lists(
    st.tuples(st.integers(1, 48), st.integers(1, 24), st.sampled_from([0.0, 0.0, 0.002, 0.01])),
    min_size=1,
    max_size=24,
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    work=_workloads,
    policy=st.sampled_from(["continuous", "static"]),
    chunked=st.booleans(),
    allocation=st.sampled_from(["paged", "reserved"]),
    block_size=st.sampled_from([1, 2, 4, 16]),
    pool_tokens=st.integers(8, 256),
    budget=st.integers(1, 96),
    max_num_seqs=st.integers(1, 8),
    max_model_len=st.integers(16, 128),
)
def test_random_workloads_run_to_completion_within_budgets(
    work, policy, chunked, allocation, block_size, pool_tokens, budget, max_num_seqs,
    max_model_len,
):
    num_blocks = max(1, pool_tokens // block_size)
    cfg = SchedulerConfig(
        max_model_len=max_model_len, batching=policy, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget, chunked_prefill=chunked,
    )
    ex = _FakeExecutor()
    eng = Engine(EngineConfig(cfg, num_blocks, block_size, allocation), ex, VirtualClock())
    ex.engine = eng
    t = 0.0
    reqs = []
    for i, (p, o, gap) in enumerate(work):
        t += gap
        reqs.append(Request(i, p, o, arrival_time=t))

    def on_step(so):
        ex.prev_running = {id(r) for r in eng.scheduler.running}
        rec = so.record
        assert rec.num_prefill_tokens + rec.num_decode_tokens <= budget
        assert rec.num_running <= max_num_seqs
        assert rec.kv_blocks_used <= num_blocks

    assert run_until_done(eng, reqs, on_step=on_step)
    assert ex.new_batches_while_running == 0  # static: never admits into a running batch
    for r in reqs:
        reason = eng.scheduler.rejection_reason(r) if r.status != RequestStatus.REJECTED else None
        if r.status == RequestStatus.REJECTED:
            assert r.finish_reason and not r.token_times
        else:
            assert reason is None
            assert r.status == RequestStatus.FINISHED
            assert r.num_output_tokens == r.max_tokens  # exactly max_tokens, preempted or not
            assert len(r.token_times) == r.max_tokens
            assert r.block_table == []
    assert eng.block_manager.num_free_blocks == num_blocks
    assert not eng.scheduler.running and not eng.scheduler.waiting
    starts = [rec.start_s for rec in eng.records]
    assert starts == sorted(starts)


# ---- abort ----------------------------------------------------------------------------------
def test_remove_frees_a_running_or_waiting_request():
    eng = make_engine(num_blocks=8, block_size=4, max_num_batched_tokens=8, max_num_seqs=1)
    s = eng.scheduler
    a, b = Request(0, 8, 4), Request(1, 4, 4)
    eng.add_request(a)
    eng.add_request(b)
    step(eng)
    assert len(a.block_table) == 2 and s.waiting[0] is b
    s.remove(a)
    assert a not in s.running and a.block_table == [] and s.bm.num_free_blocks == 8
    s.remove(b)
    assert not s.waiting and s.num_unfinished == 0
