"""Swap preemption, priority scheduling and prefix caching, hand-computed.

Each test drives the real Engine (schedule -> execute -> postprocess) with a trivial executor
that samples token 7 for every row that completes, and checks every iteration's plan, block
tables and counters against numbers worked out by hand from the rules in engine/core/scheduler.py
and engine/core/prefix_caching.py. Free GPU blocks are a stack (``range(n - 1, -1, -1)``: block 0
is handed out first, and the last block freed is reused first); the CPU pool likewise.
"""

from __future__ import annotations

import pytest

from cbbench.engine.core.block_manager import BlockManager
from cbbench.engine.core.clock import VirtualClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.prefix_caching import PrefixCachingBlockManager, hash_block
from cbbench.engine.core.request import Request, RequestStatus, SamplingParams
from cbbench.engine.core.scheduler import SchedulerConfig, _Step
from cbbench.engine.core.scheduler_output import ExecutorOutput, SchedulerOutput
from cbbench.engine.model_config import get_model_config
from cbbench.engine.sim.cost_model import CostModel
from cbbench.engine.sim.gpu_specs import get_gpu_spec
from cbbench.engine.sim.sim_executor import SimExecutor, encoder_flops

TOKEN = 7  # what the executor samples


class TokenExecutor:
    def __init__(self) -> None:
        self.tables: dict[int, list[int]] = {}  # block tables as the last forward saw them

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        self.tables = {r.request_id: list(r.block_table) for r in sched.scheduled_reqs}
        sampled = [
            TOKEN if r.num_computed_tokens + n == r.num_tokens else None
            for r, n in zip(sched.scheduled_reqs, sched.num_scheduled_tokens)
        ]
        return ExecutorOutput(sampled_token_ids=sampled, duration_s=1e-3)


def make_engine(
    num_blocks: int, block_size: int = 4, cpu_blocks: int = 0, caching: bool = False, **cfg
) -> Engine:
    cfg.setdefault("max_num_batched_tokens", 64)
    sched = SchedulerConfig(max_model_len=4096, **cfg)
    return Engine(
        EngineConfig(sched, num_blocks, block_size, num_cpu_blocks=cpu_blocks,
                     enable_prefix_caching=caching),
        TokenExecutor(),
        VirtualClock(),
    )  # fmt: skip


def step(eng: Engine):
    out = eng.step()
    assert out is not None
    sched = eng.scheduler
    live = list(sched.running) + list(sched.waiting)
    eng.block_manager.check_invariants(live)
    if eng.cpu_block_manager is not None:
        eng.cpu_block_manager.check_invariants(live, cpu=True)
    return out


def plan(out) -> list[tuple[int, int]]:
    s = out.scheduled
    return [(r.request_id, n) for r, n in zip(s.scheduled_reqs, s.num_scheduled_tokens)]


def ids(*tokens: int) -> list[int]:
    return list(tokens)


# ---- swap preemption ------------------------------------------------------------------------
def _two_requests_in_four_blocks(preemption: str, cpu_blocks: int):
    """4 GPU blocks of 4 tokens; a and b (prompt 4, 8 outputs) each need 3 blocks at most:
    both fit alone, not together. Runs to b's preemption at a's 9th token (step 6)."""
    eng = make_engine(4, cpu_blocks=cpu_blocks, preemption_mode=preemption)
    a, b = Request(0, 4, 8), Request(1, 4, 8)
    eng.add_request(a)
    eng.add_request(b)
    assert plan(step(eng)) == [(0, 4), (1, 4)]  # blocks a:[0], b:[1]
    assert plan(step(eng)) == [(0, 1), (1, 1)]  # token 5 crosses: a:[0,2], b:[1,3]; pool dry
    for _ in range(3):
        assert plan(step(eng)) == [(0, 1), (1, 1)]
    assert a.block_table == [0, 2] and b.block_table == [1, 3]
    assert b.num_computed_tokens == 8 and b.num_output_tokens == 5
    out = step(eng)  # a's 9th token needs a third block: b, the newest, is preempted
    assert plan(out) == [(0, 1)]
    assert out.scheduled.preempted == [b]
    return eng, a, b, out


def test_swap_preemption_keeps_the_kv_and_resumes_with_a_decode():
    eng, a, b, out = _two_requests_in_four_blocks("swap", cpu_blocks=8)
    # b's 8 computed tokens fill 2 blocks: copied to CPU blocks 0 and 1, GPU blocks freed.
    assert out.scheduled.swap_out == [(1, 0), (3, 1)]
    assert out.scheduled.swap_in == []
    assert b.status == RequestStatus.SWAPPED
    assert b.num_computed_tokens == 8 and b.num_output_tokens == 5  # nothing to recompute
    assert b.cpu_block_table == [0, 1] and b.block_table == []
    assert a.block_table == [0, 2, 1]  # b's first block freed last, so reused first
    rec = out.record
    assert (rec.num_preempted, rec.num_swapped_out_blocks, rec.num_swapped_in_blocks) == (1, 2, 0)
    assert eng.cpu_block_manager.num_free_blocks == 6
    # b needs 3 GPU blocks to resume (8 tokens + its next); one is free until a finishes.
    for _ in range(2):
        out = step(eng)
        assert plan(out) == [(0, 1)] and out.scheduled.swap_in == []
    assert a.status == RequestStatus.FINISHED  # a freed [0, 2, 1]
    out = step(eng)
    # b comes back as a decode: one token, its KV copied in (CPU 0 -> GPU 0, CPU 1 -> GPU 2).
    assert plan(out) == [(1, 1)]
    assert out.scheduled.num_decode_reqs == 1 and out.scheduled.num_prefill_tokens == 0
    assert out.scheduled.swap_in == [(0, 0), (1, 2)]
    assert b.block_table == [0, 2, 1] and b.cpu_block_table == []
    assert out.record.num_swapped_in_blocks == 2
    assert eng.cpu_block_manager.num_free_blocks == 8  # released at the end of the step
    while eng.has_unfinished():
        step(eng)
    assert b.num_output_tokens == 8 and b.num_preemptions == 1
    assert len(eng.records) == 11
    # The same run by recompute resumes b with a 9-token prefill instead (prompt + 5 outputs).
    eng2, _, b2, out2 = _two_requests_in_four_blocks("recompute", cpu_blocks=0)
    assert b2.status == RequestStatus.PREEMPTED and b2.num_computed_tokens == 0
    assert out2.scheduled.swap_out == [] and not out2.scheduled.has_swaps


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    eng, a, b, out = _two_requests_in_four_blocks("swap", cpu_blocks=1)  # b needs 2
    assert out.scheduled.swap_out == []
    assert b.status == RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and b.cpu_block_table == []
    assert eng.cpu_block_manager.num_free_blocks == 1
    while eng.has_unfinished():
        out = step(eng)
        assert not out.scheduled.swap_in
    assert b.num_output_tokens == 8


def test_swap_of_a_partial_prefill_resumes_the_remaining_chunk():
    # Budget 8, 4 blocks of 4. a (prompt 4, 12 outputs) runs; b (prompt 10) is chunked: 7
    # tokens next to a's decode. a's 9th token then needs a 3rd block with b holding 2.
    eng = make_engine(4, cpu_blocks=4, preemption_mode="swap", max_num_batched_tokens=8)
    a = Request(0, 4, 12)
    eng.add_request(a)
    assert plan(step(eng)) == [(0, 4)]  # a:[0]
    b = Request(1, 10, 2)
    eng.add_request(b)
    assert plan(step(eng)) == [(0, 1), (1, 7)]  # a:[0,1] (5th token), b:[2,3]
    out = step(eng)  # a decodes (6th); b's last 3 prompt tokens need a 3rd block: none
    # b is the newest: swapped out with its 7 computed tokens (2 blocks) ...
    assert out.scheduled.preempted == [b]
    assert out.scheduled.swap_out == [(2, 0), (3, 1)]
    assert plan(out) == [(0, 1)]
    assert b.status == RequestStatus.SWAPPED and b.num_computed_tokens == 7
    # ... and comes back, when a has left room, for its last 3 prompt tokens, not 10.
    while b.status != RequestStatus.RUNNING:
        out = step(eng)
    assert (1, 3) in plan(out)
    assert len(out.scheduled.swap_in) == 2
    while eng.has_unfinished():
        step(eng)
    assert b.num_output_tokens == 2 and a.num_output_tokens == 12


def test_a_swap_in_cancelled_in_its_own_step_leaves_the_kv_in_the_cpu_pool():
    # Defensive path: a request swapped in and then chosen as a victim in the same step keeps
    # its CPU copy and lists no copies (white-box: the public paths never pick it today).
    eng, a, b, _ = _two_requests_in_four_blocks("swap", cpu_blocks=8)
    while a.status != RequestStatus.FINISHED:
        step(eng)
    s = eng.scheduler
    step_ = _Step()
    s._admit(step_, 64, 0.0)
    assert b.status == RequestStatus.RUNNING and step_.swap_in == [(0, 0), (1, 2)]
    victim, _, taken, _ = s._preempt(step_)
    assert victim is b and taken == 1
    assert b.status == RequestStatus.SWAPPED and b.cpu_block_table == [0, 1]
    assert b.block_table == [] and step_.swap_in == []
    out = s._output(step_, 64, 0)
    assert out.swap_in == [] and out.is_empty and out.preempted == [b]
    assert eng.cpu_block_manager.num_free_blocks == 6  # still holding b's KV
    eng.block_manager.check_invariants([b])
    eng.cpu_block_manager.check_invariants([b], cpu=True)


def test_abort_of_a_swapped_request_frees_its_cpu_blocks():
    eng, _, b, _ = _two_requests_in_four_blocks("swap", cpu_blocks=8)
    eng.abort_request(b)
    assert b.status == RequestStatus.ABORTED and b.cpu_block_table == []
    assert eng.cpu_block_manager.num_free_blocks == 8
    assert b not in eng.scheduler.waiting


def test_sim_swap_time_is_vllm_v0s_per_layer_per_block_copies():
    # Llama-3-8B bf16, 16-token blocks: 16 * 131,072 B = 2 MiB a block; H200 host link 50 GB/s.
    # vLLM V0's swap_blocks issues one cudaMemcpyAsync per block, per layer, for K and for V:
    # 32 x 2 = 64 copies of 32 KiB a block, each with its fixed cost (9 us): 618 us a block,
    # ~3.4 GB/s, not the link's 50 GB/s (41.9 us) that hid the copies' count.
    model, gpu = get_model_config("llama-3-8b"), get_gpu_spec("h200")
    cost = CostModel(model, "bf16", gpu)
    per_block = 64 * 9e-6 + 16 * 131_072 / 50e9
    assert cost.swap_time(1, 16) == pytest.approx(per_block) == pytest.approx(617.9e-6, rel=1e-3)
    r = Request(0, 32, 8)
    r.status = RequestStatus.RUNNING
    base = SchedulerOutput([r], [32], 0, 32, 2048)
    swapped = SchedulerOutput([r], [32], 0, 32, 2048, swap_out=[(5, 0), (6, 1)], swap_in=[(2, 9)])
    ex = SimExecutor(cost, block_size=16)
    t0, t1 = ex.execute(base), ex.execute(swapped)
    assert t1.swap_time_s == pytest.approx(3 * per_block)
    assert t1.duration_s == pytest.approx(t0.duration_s + 3 * per_block)
    assert t1.bytes_moved == t0.bytes_moved  # the host link is not HBM traffic


# ---- priority scheduling --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "order"), [("fcfs", [0, 1, 2, 3, 4, 5]), ("priority", [1, 3, 5, 2, 4, 0])]
)
def test_admission_order(policy, order):
    eng = make_engine(64, queue_policy=policy, max_num_seqs=1)
    # All arrive at t = 0: priority runs the 0s, then the 1s, then the 2, each class in the
    # order added.
    for i, p in enumerate([2, 0, 1, 0, 1, 0]):
        eng.add_request(Request(i, 4, 1, priority=p))
    assert [plan(step(eng))[0][0] for _ in range(6)] == order


def test_priority_ties_break_by_arrival_time_before_queue_order():
    eng = make_engine(64, queue_policy="priority", max_num_seqs=1)
    eng.add_request(Request(0, 4, 1, arrival_time=0.5, priority=0))
    eng.add_request(Request(1, 4, 1, arrival_time=0.2, priority=0))
    eng.clock.advance_to(1.0)
    assert [plan(step(eng))[0][0] for _ in range(2)] == [1, 0]


def test_a_higher_priority_arrival_preempts_the_lowest_newest_among_equals():
    # 7 blocks of 4. M (priority 1), L1 and L2 (priority 2; L1 older) run; H (priority 0)
    # arrives when the pool is dry.
    eng = make_engine(7, queue_policy="priority")
    l1 = Request(0, 8, 4, priority=2)
    l2 = Request(1, 4, 4, priority=2)
    m = Request(2, 4, 4, priority=1)
    for r in (l1, l2, m):
        eng.add_request(r)
    out = step(eng)
    assert plan(out) == [(2, 4), (0, 8), (1, 4)]  # admitted by priority: M first
    assert eng.block_manager.num_free_blocks == 3
    assert plan(step(eng)) == [(2, 1), (0, 1), (1, 1)]  # each crosses into a new block
    assert eng.block_manager.num_free_blocks == 0
    h = Request(3, 4, 2, priority=0)
    eng.add_request(h)
    out = step(eng)
    # Decodes are planned first; then H needs 1 block: L2 (priority 2, newer than L1) is
    # preempted, its decode token taken back, and H prefills in the same step.
    assert out.scheduled.preempted == [l2]
    assert plan(out) == [(2, 1), (0, 1), (3, 4)]
    assert out.scheduled.num_decode_reqs == 2 and out.scheduled.num_prefill_tokens == 4
    assert l2.status == RequestStatus.PREEMPTED and l2.num_preemptions == 1
    assert l2.num_output_tokens == 2 and l2.num_computed_tokens == 0
    assert l1.status == m.status == h.status == RequestStatus.RUNNING
    out = step(eng)
    # L2 now heads the queue but ranks with L1, not below: no preemption, it waits.
    assert plan(out) == [(2, 1), (0, 1), (3, 1)]
    assert out.scheduled.preempted == []
    assert list(eng.scheduler.waiting) == [l2]
    while eng.has_unfinished():
        step(eng)
    assert all(r.num_output_tokens == r.max_tokens for r in (l1, l2, m, h))


def test_an_equal_priority_arrival_does_not_preempt():
    eng = make_engine(3, queue_policy="priority")
    a = Request(0, 8, 2, priority=1)  # 2 blocks for its prompt, a 3rd for its 9th token
    eng.add_request(a)
    step(eng)
    b = Request(1, 4, 2, priority=1)
    eng.add_request(b)
    out = step(eng)  # a takes the last block and finishes; b does not outrank a: it waits
    assert out.scheduled.preempted == [] and plan(out) == [(0, 1)]
    assert plan(step(eng)) == [(1, 4)]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_kv_growth_preempts_the_lowest_priority_not_the_newest(policy):
    # 4 blocks of 4. A (priority 2) is admitted first, B (priority 0) one step later; A's 9th
    # token (step 6) needs a block with the pool dry.
    eng = make_engine(4, queue_policy=policy)
    a = Request(0, 4, 8, priority=2)
    eng.add_request(a)
    assert plan(step(eng)) == [(0, 4)]
    b = Request(1, 4, 8, priority=0)
    eng.add_request(b)
    assert plan(step(eng)) == [(0, 1), (1, 4)]
    for _ in range(3):
        assert plan(step(eng)) == [(0, 1), (1, 1)]
    out = step(eng)
    if policy == "fcfs":
        # The newest, B, goes, although it outranks A.
        assert out.scheduled.preempted == [b] and plan(out) == [(0, 1)]
    else:
        # A itself is the lowest: it goes, and B (after it in running) still decodes.
        assert out.scheduled.preempted == [a] and plan(out) == [(1, 1)]
    while eng.has_unfinished():
        step(eng)
    assert a.num_output_tokens == b.num_output_tokens == 8


def test_priority_with_swap_swaps_the_victim_out_and_back():
    eng = make_engine(3, cpu_blocks=4, queue_policy="priority", preemption_mode="swap")
    low = Request(0, 8, 3, priority=5)
    eng.add_request(low)
    assert plan(step(eng)) == [(0, 8)]  # low:[0,1]
    high = Request(1, 6, 2, priority=0)
    eng.add_request(high)
    out = step(eng)
    # high needs 2 blocks, 1 is free: low (8 computed tokens, 2 blocks) is swapped out.
    assert out.scheduled.preempted == [low]
    assert out.scheduled.swap_out == [(0, 0), (1, 1)]
    assert plan(out) == [(1, 6)]
    assert low.status == RequestStatus.SWAPPED and low.num_computed_tokens == 8
    out = step(eng)  # high decodes and finishes (2 outputs); low cannot fit yet
    assert plan(out) == [(1, 1)] and high.status == RequestStatus.FINISHED
    out = step(eng)
    assert plan(out) == [(0, 1)] and len(out.scheduled.swap_in) == 2
    while eng.has_unfinished():
        step(eng)
    assert low.num_output_tokens == 3 and low.num_preemptions == 1


class ScriptExecutor(TokenExecutor):
    """Samples the given tokens in turn, for every row that completes."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__()
        self.tokens = iter(tokens)

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        out = super().execute(sched)
        sampled = [None if t is None else next(self.tokens) for t in out.sampled_token_ids]
        return ExecutorOutput(sampled_token_ids=sampled, duration_s=1e-3)


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_a_stop_token_id_ends_the_request_ignore_eos_or_not(ignore_eos):
    """vLLM's stop_token_ids, by hand: the request ends at the first of its stop ids it
    samples (finish_reason stop, the id its last output token); the model's EOS (5) only
    without ignore_eos."""
    eng = make_engine(16)
    eng.executor = ScriptExecutor([3, 5, 9, 4, 9, 8])
    a = Request(0, 4, 6, eos_token_ids=(5,), sampling=SamplingParams(
        ignore_eos=ignore_eos, stop_token_ids=frozenset({9, 8})))
    eng.add_request(a)
    while eng.has_unfinished():
        step(eng)
    assert a.output_token_ids == ([3, 5, 9] if ignore_eos else [3, 5])
    assert a.finish_reason == "stop"


def test_abort_takes_a_request_out_of_the_priority_queue():
    eng = make_engine(64, queue_policy="priority", max_num_seqs=1)
    reqs = [Request(i, 4, 1, priority=p) for i, p in enumerate([3, 1, 2])]
    for r in reqs:
        eng.add_request(r)
    eng.abort_request(reqs[2])
    assert reqs[2] not in eng.scheduler.waiting and len(eng.scheduler.waiting) == 2
    assert [plan(step(eng))[0][0] for _ in range(2)] == [1, 0]


# ---- prefix caching -------------------------------------------------------------------------
def test_a_shared_prefix_is_reused_and_only_the_rest_is_computed():
    eng = make_engine(16, caching=True)
    bm = eng.block_manager
    a = Request(0, 10, 2, prompt_token_ids=ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10))
    eng.add_request(a)
    out = step(eng)
    assert plan(out) == [(0, 10)]
    assert (out.record.num_cached_tokens, out.record.num_prefix_queried_tokens) == (0, 10)
    assert a.block_table == [0, 1, 2]
    # Its two full blocks are registered once computed; the third (2 tokens) is not full.
    h1 = hash_block(0, [1, 2, 3, 4])
    h2 = hash_block(h1, [5, 6, 7, 8])
    assert bm.cached == {h1: 0, h2: 1}
    b = Request(1, 11, 2, prompt_token_ids=ids(1, 2, 3, 4, 5, 6, 7, 8, 50, 51, 52))
    eng.add_request(b)
    out = step(eng)
    # b starts after the 8 cached tokens: 3 prompt tokens to compute, next to a's decode.
    assert plan(out) == [(0, 1), (1, 3)]
    assert (out.record.num_cached_tokens, out.record.num_prefix_queried_tokens) == (8, 11)
    assert out.record.num_prefill_tokens == 3
    assert b.block_table == [0, 1, 3] and b.num_cached_tokens == 8
    assert a.status == RequestStatus.FINISHED  # a released its share of blocks 0 and 1
    assert bm.ref_counts[:4] == [1, 1, 0, 1]
    assert b.num_computed_tokens == 11 and b.output_token_ids == [TOKEN]


def test_the_last_token_is_always_computed():
    eng = make_engine(16, caching=True)
    eng.add_request(Request(0, 8, 1, prompt_token_ids=ids(1, 2, 3, 4, 5, 6, 7, 8)))
    step(eng)
    # An identical 8-token prompt: both blocks are cached, but the 8th token must be computed
    # (its row gives the first output), so only the first block is reused.
    twin = Request(1, 8, 1, prompt_token_ids=ids(1, 2, 3, 4, 5, 6, 7, 8))
    eng.add_request(twin)
    out = step(eng)
    assert plan(out) == [(1, 4)] and out.record.num_cached_tokens == 4


def test_a_prefix_scheduled_in_this_step_is_a_hit_for_a_later_admission_in_it():
    """vLLM V1 caches a request's full blocks when they are allocated (allocate_slots ->
    cache_blocks, before the forward): a request admitted later in the same step finds them.
    Hand-computed, 4-token blocks, budget 64: a (12 tokens) takes 3 blocks; b, its twin, finds
    2 (its last token is always computed) and computes 4; c (a's 12 + 2) finds all 3 and
    computes 2. KV: 3 + 1 + 1 blocks. Before, blocks were registered after the step: nothing
    hit, 38 tokens were computed in 10 blocks."""
    eng = make_engine(20, caching=True)
    p = list(range(100, 112))
    for i, prompt in enumerate((p, list(p), p + [7, 8])):
        eng.add_request(Request(i, len(prompt), 2, prompt_token_ids=prompt))
    out = step(eng)
    assert plan(out) == [(0, 12), (1, 4), (2, 2)]
    rec = out.record
    assert (rec.num_cached_tokens, rec.num_prefix_queried_tokens) == (8 + 12, 38)
    assert rec.num_prefill_tokens == 18 and rec.kv_blocks_used == 5
    # A chunk counts too: d (24 tokens, budget 16) computes 16 then 8; e, its twin, arrives
    # for the second step and finds the 5 blocks of 23 tokens d holds by that step's end.
    eng = make_engine(20, caching=True, max_num_batched_tokens=16)
    q = list(range(200, 224))
    eng.add_request(Request(0, 24, 2, prompt_token_ids=q))
    assert plan(step(eng)) == [(0, 16)]
    eng.add_request(Request(1, 24, 2, prompt_token_ids=list(q)))
    out = step(eng)
    assert plan(out) == [(0, 8), (1, 4)] and out.record.num_cached_tokens == 20


def test_a_step_that_fails_leaves_no_uncomputed_block_cached():
    """The blocks registered when a step was scheduled hold no KV if the step fails: a later
    twin must compute its prompt, not read them."""
    eng = make_engine(20, caching=True)
    p = list(range(100, 112))
    eng.add_request(Request(0, 12, 2, prompt_token_ids=p))

    def boom(sched):
        raise RuntimeError("device lost")

    ok = eng.executor.execute
    eng.executor.execute = boom
    with pytest.raises(Exception, match="device lost"):
        eng.step()
    eng.executor.execute = ok
    eng.add_request(Request(1, 12, 2, prompt_token_ids=list(p)))
    out = step(eng)
    assert plan(out) == [(1, 12)] and out.record.num_cached_tokens == 0


def test_a_victim_read_in_its_step_by_an_admission_is_not_preempted():
    """Priority, 4 blocks of 4, budget 8: L (priority 2, 12 tokens) computes 8, then its last
    4 (block 2, registered as scheduled). A (priority 0, L's 12 + 1) finds L's 3 blocks in
    that step; B (priority 1) then finds the pool dry. A reads block 2, whose KV L writes in
    this step's forward: L is not preempted, B waits."""
    eng = make_engine(4, caching=True, queue_policy="priority", max_num_batched_tokens=8)
    q = list(range(100, 112))
    eng.add_request(Request(0, 12, 1, prompt_token_ids=q, priority=2))
    assert plan(step(eng)) == [(0, 8)]
    eng.add_request(Request(1, 13, 2, prompt_token_ids=q + [50], priority=0))
    eng.add_request(Request(2, 4, 2, prompt_token_ids=[1, 2, 3, 4], priority=1))
    out = step(eng)
    assert plan(out) == [(0, 4), (1, 1)] and out.scheduled.preempted == []
    assert out.record.num_cached_tokens == 12


def test_a_victim_taken_back_in_its_step_leaves_no_uncomputed_block_cached():
    """Priority, 5 blocks of 4, budget 12: L (priority 2, 20 tokens) computes 12, then is
    scheduled its last 8 (blocks 3 and 4, registered as scheduled); B (priority 1) finds the
    pool dry and preempts L, whose 8 tokens are taken back. B takes block 4; block 3 must not
    stay findable (its KV is never written)."""
    eng = make_engine(5, caching=True, queue_policy="priority", max_num_batched_tokens=12)
    q = list(range(100, 120))
    eng.add_request(Request(0, 20, 1, prompt_token_ids=q, priority=2))
    assert plan(step(eng)) == [(0, 12)]
    eng.add_request(Request(1, 4, 2, prompt_token_ids=[1, 2, 3, 4], priority=1))
    out = step(eng)
    assert [r.request_id for r in out.scheduled.preempted] == [0] and plan(out) == [(1, 4)]
    h = 0
    for i in range(3):
        h = hash_block(h, q[4 * i : 4 * i + 4])
    cached = eng.block_manager.cached
    assert h in cached and hash_block(h, q[12:16]) not in cached  # computed blocks only


def test_lru_eviction_takes_the_tail_of_the_least_recently_used_prefix_first():
    eng = make_engine(4, caching=True)
    bm = eng.block_manager
    a = Request(0, 9, 1, prompt_token_ids=ids(1, 2, 3, 4, 5, 6, 7, 8, 9))
    eng.add_request(a)
    step(eng)  # a: [0, 1, 2], finishes; blocks 0, 1 cached, block 2 (1 token) free
    assert bm._free == [3, 2] and list(bm.evictable) == [1, 0]  # tail released first
    assert bm.num_free_blocks == 4 and bm.num_used_blocks == 0
    d = Request(1, 12, 1, prompt_token_ids=list(range(100, 112)))
    eng.add_request(d)
    step(eng)  # d needs 3 blocks: 2 and 3 from the free stack, then evicts block 1
    assert eng.executor.tables[1] == [2, 3, 1] and bm.num_evictions == 1
    assert list(bm.evictable) == [0, 1, 3, 2]  # d's full blocks cached too, tail first
    b = Request(2, 9, 1, prompt_token_ids=ids(1, 2, 3, 4, 5, 6, 7, 8, 60))
    eng.add_request(b)
    out = step(eng)
    # a's first block survived: b reuses it, computes 5 tokens, and evicts two of d's.
    assert plan(out) == [(2, 5)] and out.record.num_cached_tokens == 4
    assert eng.executor.tables[2] == [0, 1, 3] and bm.num_evictions == 3
    bm.check_invariants([])


def test_output_blocks_are_hashed_as_they_fill():
    eng = make_engine(16, caching=True)
    a = Request(0, 6, 4, prompt_token_ids=ids(1, 2, 3, 4, 5, 6))
    eng.add_request(a)
    while eng.has_unfinished():
        step(eng)
    # a's tokens: 1..6 then 7 7 7 7; KV computed for 9 of them: 2 full blocks, the second
    # holding two outputs.
    assert eng.block_manager.num_cached_blocks == 2
    b = Request(1, 9, 1, prompt_token_ids=ids(1, 2, 3, 4, 5, 6, 7, 7, 7))
    eng.add_request(b)
    out = step(eng)
    assert plan(out) == [(1, 1)] and out.record.num_cached_tokens == 8


def test_a_recomputed_request_reuses_what_is_left_of_its_own_blocks():
    # The recompute scenario with token ids: b's 2 full blocks are registered when it is
    # preempted; a takes the least recently released (b's second) at once, so b comes back
    # with its first block cached.
    eng = make_engine(4, caching=True)
    a = Request(0, 4, 8, prompt_token_ids=ids(1, 2, 3, 4))
    b = Request(1, 4, 8, prompt_token_ids=ids(5, 6, 7, 8))
    eng.add_request(a)
    eng.add_request(b)
    for _ in range(5):
        step(eng)
    out = step(eng)
    assert out.scheduled.preempted == [b] and a.block_table == [0, 2, 3]
    while a.status != RequestStatus.FINISHED:
        step(eng)
    out = step(eng)
    assert plan(out) == [(1, 5)]  # 9 known tokens, the first 4 cached
    # Its own blocks: counted apart from the hit rate's, as vLLM's preempted_hits.
    assert (out.record.num_cached_tokens, out.record.num_prefix_queried_tokens) == (0, 0)
    assert (out.record.num_preempted_cached_tokens,
            out.record.num_preempted_queried_tokens) == (4, 9)
    assert b.block_table == [1, 3, 2]
    while eng.has_unfinished():
        step(eng)
    assert b.output_token_ids == [TOKEN] * 8


def test_a_resumed_request_keeps_its_first_schedulings_cached_tokens():
    """vLLM's rule (v1 scheduler: ``if request.num_cached_tokens < 0``): the count usage
    reports is set once, at the first scheduling. b's prompt was computed from scratch; back
    after its recompute preemption it finds its own first block cached (4 tokens), which is
    where that prefill starts (the vision encoder's charge goes by it; the step counts it among
    the resumed requests' hits, vLLM's preempted_hits), not what its usage reports."""
    eng = make_engine(4, caching=True)
    charged: list[float] = []  # each step's vision-encoder FLOPs, as the simulator prices them
    run = eng.executor.execute

    def execute(sched):
        charged.append(encoder_flops(sched))
        return run(sched)

    eng.executor.execute = execute  # type: ignore[method-assign]
    a = Request(0, 4, 8, prompt_token_ids=ids(1, 2, 3, 4))
    b = Request(1, 4, 8, prompt_token_ids=ids(5, 6, 7, 8), encoder_flops=1e9)
    eng.add_request(a)
    eng.add_request(b)
    step(eng)
    assert b.num_cached_tokens == 0 and charged == [1e9]
    for _ in range(5):
        out = step(eng)
    assert out.scheduled.preempted == [b]
    while a.status != RequestStatus.FINISHED:
        step(eng)
    out = step(eng)
    assert plan(out) == [(1, 5)] and out.record.num_preempted_cached_tokens == 4
    assert b.num_computed_at_admission == 4 and b.num_preemptions == 1
    assert b.num_cached_tokens == 0  # was 4: the resume's hits
    assert charged[-1] == 1e9 and sum(charged) == 2e9  # its encoder runs again at the resume


def test_length_only_requests_never_hit():
    eng = make_engine(16, caching=True)
    for i in range(2):
        eng.add_request(Request(i, 12, 1))
    while eng.has_unfinished():
        out = step(eng)
        assert out.record.num_cached_tokens == 0
    assert eng.block_manager.num_cached_blocks == 0


def test_block_managers_share_one_interface():
    plain, caching = BlockManager(4, 4), PrefixCachingBlockManager(4, 4)
    r = Request(0, 8, 1, prompt_token_ids=list(range(8)))
    assert plain.lookup_prefix(r) == [] and not plain.enable_prefix_caching
    assert caching.lookup_prefix(r) == [] and caching.enable_prefix_caching
    assert plain.allocate_blocks(5) is None and plain.allocate_blocks(2) == [0, 1]
    plain.free_blocks([0, 1])
    assert plain.num_free_blocks == 4


def test_config_rejects_unknown_policies():
    with pytest.raises(ValueError, match="preemption mode"):
        SchedulerConfig(max_model_len=8, preemption_mode="offload")
    with pytest.raises(ValueError, match="scheduling policy"):
        SchedulerConfig(max_model_len=8, queue_policy="lifo")
