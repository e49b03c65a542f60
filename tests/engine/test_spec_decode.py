"""Speculative decoding in the scheduler, the engine's postprocess and the simulator, against
numbers computed by hand (the rules: engine/core/spec_decode.py, engine/core/scheduler.py
``_schedule_drafts``, engine/core/engine.py ``_postprocess``; docs/speculative.md).
"""

from __future__ import annotations

import json
import random

import pytest
from helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbbench.engine.core.clock import VirtualClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.feed import run_until_done
from cbbench.engine.core.request import Request, RequestStatus, SamplingParams
from cbbench.engine.core.scheduler import SchedulerConfig
from cbbench.engine.core.scheduler_output import ExecutorOutput, SchedulerOutput
from cbbench.engine.core.spec_decode import (
    NGRAM_MAX,
    NGRAM_MIN,
    NgramDrafter,
    SimAcceptance,
    expected_accepted_tokens,
    max_drafts,
    ngram_lookup,
)
from cbbench.engine.model_config import get_model_config
from cbbench.engine.sim.cost_model import BatchShape, CostModel
from cbbench.engine.sim.gpu_specs import get_gpu_spec


class FixedDrafter:
    """Proposes ``k`` drafts (ids 100, 101, ...), capped by the output budget unless told."""

    def __init__(self, k: int, cap: bool = True) -> None:
        self.k, self.cap = k, cap

    def propose(self, req: Request) -> list[int]:
        n = max_drafts(req, self.k) if self.cap else self.k
        return list(range(100, 100 + n))


class ScriptedExecutor:
    """Accepts ``accept`` drafts of every verifying decode (capped by its drafts) and samples
    ``token`` for every row that completes; records each plan."""

    def __init__(self, accept: int = 0, token: int | None = None) -> None:
        self.accept, self.token = accept, token
        self.plans: list[SchedulerOutput] = []

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        self.plans.append(sched)
        reqs = sched.scheduled_reqs
        accepted = [min(self.accept, len(r.spec_token_ids)) for r in reqs]
        sampled = None if self.token is None else [self.token] * len(reqs)
        return ExecutorOutput(sampled, duration_s=1e-3, num_accepted=accepted)


def make_engine(drafter, executor, num_blocks=100, block_size=4, **cfg) -> Engine:
    config = EngineConfig(SchedulerConfig(max_model_len=4096, **cfg), num_blocks, block_size)
    return Engine(config, executor, VirtualClock(), drafter=drafter)


def plan(out: SchedulerOutput) -> list[tuple[int, int]]:
    return [(r.request_id, n) for r, n in zip(out.scheduled_reqs, out.num_scheduled_tokens)]


# ---- the arithmetic ----------------------------------------------------------------------------
def test_expected_acceptance_of_the_issue_example():
    # K=3, A=0.7: E = 0.7 + 0.49 + 0.343 = 1.533 accepted, 1.533 / 3 = 0.511 per draft token,
    # 2.533 tokens per step (the bonus token included).
    e = expected_accepted_tokens(3, 0.7)
    assert e == pytest.approx(1.533)
    assert e / 3 == pytest.approx(0.511)
    assert 1 + e == pytest.approx(2.533)
    assert expected_accepted_tokens(4, 1.0) == 4 and expected_accepted_tokens(4, 0.0) == 0


def test_sim_acceptance_draws_follow_the_conditional_rule():
    acc = SimAcceptance(0.7, seed=1)
    draws = [acc.accepted(3) for _ in range(100_000)]
    # P(accepted >= i) = A^i: 0.7, 0.49, 0.343 (each within 5 standard errors).
    for i, p in ((1, 0.7), (2, 0.49), (3, 0.343)):
        share = sum(a >= i for a in draws) / len(draws)
        assert abs(share - p) < 5 * (p * (1 - p) / len(draws)) ** 0.5, (i, share)
    assert sum(draws) / len(draws) == pytest.approx(1.533, abs=0.02)
    assert {SimAcceptance(1.0).accepted(5), SimAcceptance(0.0).accepted(5)} == {5, 0}
    # Seeded: the same seed draws the same sequence.
    a, b = SimAcceptance(0.5, seed=7), SimAcceptance(0.5, seed=7)
    assert [a.accepted(4) for _ in range(50)] == [b.accepted(4) for _ in range(50)]


def test_ngram_lookup_proposes_what_followed_the_earliest_match():
    # Suffix [7, 8] (the longest recurring: [6, 7, 8] occurs only at the end); its earliest
    # occurrence is at index 0, followed by 9, 9, 9: vLLM's NgramProposer drafts these (its
    # KMP over the reversed tokens moves to each later-scanned tie). The latest occurrence's
    # 1, 2, 6 were drafted before.
    tokens = [7, 8, 9, 9, 9, 7, 8, 1, 2, 6, 7, 8]
    assert ngram_lookup(tokens, 3, 2, 4) == [9, 9, 9]
    assert ngram_lookup([1, 2, 3, 1, 2, 4, 1, 2], 1, 2, 4) == [3]  # two 2-gram matches
    # A 4-gram match wins over shorter ones, and k caps the drafts.
    tokens = [1, 2, 3, 4, 5, 0, 2, 3, 4, 9, 1, 2, 3, 4]
    assert ngram_lookup(tokens, 2, 2, 4) == [5, 0]
    assert ngram_lookup([1, 2, 3, 4], 3, 2, 4) == []  # nothing recurs
    assert ngram_lookup([5, 5, 5], 3, 2, 4) == [5]  # only one token follows the match


def _brute_force_lookup(tokens, k, min_n, max_n):
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        for start in range(len(tokens) - n):  # the earliest first, as vLLM picks
            if tokens[start : start + n] == tokens[len(tokens) - n :]:
                return tokens[start + n : start + n + k]
    return []


def test_ngram_lookup_agrees_with_brute_force_and_the_drafter_with_both():
    rng = random.Random(0)
    for _ in range(2000):
        tokens = [rng.randrange(rng.choice([2, 3, 5, 20])) for _ in range(rng.randint(1, 50))]
        k, lo = rng.randint(1, 5), rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        assert ngram_lookup(tokens, k, lo, hi) == _brute_force_lookup(tokens, k, lo, hi)
    # The drafter's incremental token array gives the same drafts as the whole list.
    drafter = NgramDrafter(3)
    r = Request(0, 10, 40, prompt_token_ids=[1, 2, 3, 1, 2, 3, 1, 2, 3, 1])
    for _ in range(35):
        want = _brute_force_lookup(r.prompt_token_ids + r.output_token_ids, max_drafts(r, 3),
                                   NGRAM_MIN, NGRAM_MAX)  # fmt: skip
        assert drafter.propose(r) == want
        r.output_token_ids.append(rng.randrange(4))
        r.num_output_tokens += 1


# ---- the scheduler -----------------------------------------------------------------------------
def test_decode_verifies_k_plus_one_rows_and_rollback_trims_kv():
    ex = ScriptedExecutor(accept=0)
    eng = make_engine(FixedDrafter(3), ex)
    a = Request(0, 6, 10)
    eng.add_request(a)
    eng.step()  # the 6-token prefill: 1 output token, then 3 drafts proposed
    assert a.num_output_tokens == 1 and a.spec_token_ids == [100, 101, 102]
    table_before = a.block_table
    out = eng.step()
    s = ex.plans[-1]
    # Its last token + 3 drafts = 4 rows at positions 6..9: 10 KV slots = 3 blocks of 4.
    assert plan(s) == [(0, 4)]
    assert (s.num_decode_reqs, s.num_drafts, s.num_draft_tokens) == (1, 1, 3)
    assert (s.num_decode_tokens, s.num_prefill_tokens, s.total_tokens) == (4, 0, 4)
    # None accepted: 1 token gained, 7 tokens' KV kept (6 prompt + the fed token), the third
    # block (slots 8..11) held only rejected drafts and is freed; the table is a new list.
    assert out.num_new_tokens == [1] and a.num_output_tokens == 2
    assert a.num_computed_tokens == 7 and len(a.block_table) == 2
    assert a.block_table is not table_before
    assert eng.block_manager.num_used_blocks == 2
    rec = out.record
    assert (rec.num_drafts, rec.draft_tokens, rec.accepted_tokens) == (1, 3, 0)
    assert (rec.emitted_tokens, rec.num_sampled_reqs, rec.num_decode_tokens) == (1, 1, 4)


def test_accepted_drafts_keep_their_kv_and_share_the_step_time():
    ex = ScriptedExecutor(accept=2)
    eng = make_engine(FixedDrafter(3), ex)
    a = Request(0, 6, 10)
    eng.add_request(a)
    eng.step()
    out = eng.step()
    # 2 of 3 accepted: 3 tokens gained (2 drafts + the sampled one), all at the step's end;
    # KV for 6 + 1 + 2 = 9 tokens stays (3 blocks: nothing to trim).
    assert out.num_new_tokens == [3] and a.num_output_tokens == 4
    end = out.record.start_s + out.record.duration_s
    assert a.token_times[-3:] == [end] * 3 and a.token_times[0] < end
    assert a.num_computed_tokens == 9 and a.num_tokens == 10 and len(a.block_table) == 3
    assert out.record.accepted_tokens == 2 and out.record.emitted_tokens == 3


def test_drafts_stop_at_the_output_budget():
    ex = ScriptedExecutor(accept=3)
    eng = make_engine(FixedDrafter(3), ex)
    a = Request(0, 4, 6)
    eng.add_request(a)
    gained = []
    while eng.has_unfinished():
        gained.append(eng.step().num_new_tokens[0])
    # 1 (prefill), then 4 (3 drafts + bonus): 5 of 6; 1 left, so no drafts: 1 more.
    assert gained == [1, 4, 1]
    assert [len(p.scheduled_reqs[0].spec_token_ids) for p in ex.plans] == [0, 0, 0]  # cleared
    assert [p.num_draft_tokens for p in ex.plans] == [0, 3, 0]
    assert a.num_output_tokens == 6 and a.finish_reason == "length"


def test_budget_trims_drafts():
    ex = ScriptedExecutor(accept=0)
    eng = make_engine(FixedDrafter(3), ex, max_num_batched_tokens=6)
    a, b = Request(0, 3, 20), Request(1, 3, 20)
    eng.add_request(a)
    eng.add_request(b)
    eng.step()  # both prefill (3 + 3 = the budget of 6)
    eng.step()
    # A takes 1 + 3 rows; B gets what is left: 2 rows (1 + 1 draft).
    s = ex.plans[-1]
    assert plan(s) == [(0, 4), (1, 2)]
    assert (s.num_drafts, s.num_draft_tokens, s.total_tokens) == (2, 4, 6)


def test_drafts_that_do_not_fit_the_kv_pool_are_dropped_without_preempting():
    ex = ScriptedExecutor(accept=0)
    # 4 blocks of 4. After the prefills B (4 tokens) holds 1 block, A (5 tokens) 2, 1 is free.
    # B decodes first (the older) and takes the free block for slot 4. A's 3 drafts would need
    # slots 6..8 (a third block): none is free, so A decodes one row (slot 5, in its second
    # block) and nobody is preempted.
    eng = make_engine(FixedDrafter(3), ex, num_blocks=4)
    b, a = Request(0, 4, 2), Request(1, 5, 10)
    eng.add_request(b)
    eng.add_request(a)
    eng.step()
    assert a.spec_token_ids == [100, 101, 102] and b.spec_token_ids == []
    eng.step()
    s = ex.plans[-1]
    assert plan(s) == [(0, 1), (1, 1)] and s.num_drafts == 0 and not s.preempted
    assert len(a.block_table) == 2 and b.finish_reason == "length"  # B then freed its 2


def test_a_preempted_verifier_gives_back_its_draft_rows():
    # Priority: D (priority 5) decodes with 3 drafts (its third block); H (priority 0)
    # arrives needing 2 blocks with 1 free, preempts D and takes its rows back.
    ex = ScriptedExecutor(accept=0)
    eng = make_engine(FixedDrafter(3), ex, num_blocks=4, queue_policy="priority")
    d = Request(0, 7, 8, priority=5)
    eng.add_request(d)
    eng.step()
    h = Request(1, 8, 4, priority=0, arrival_time=eng.clock.now())
    eng.add_request(h)
    eng.step()
    s = ex.plans[-1]
    assert plan(s) == [(1, 8)] and s.preempted == [d]
    assert (s.num_decode_reqs, s.num_drafts, s.num_draft_tokens) == (0, 0, 0)
    assert s.num_prefill_tokens == 8
    assert d.spec_token_ids == [] and d.status == RequestStatus.PREEMPTED
    assert d.num_computed_tokens == 0 and d.block_table == []


# ---- finishing inside an accepted run --------------------------------------------------------
def test_max_tokens_inside_the_accepted_run_truncates():
    # A drafter that ignores the budget: 2 tokens left, 3 drafts all accepted -> 2 gained.
    ex = ScriptedExecutor(accept=3, token=7)
    eng = make_engine(FixedDrafter(3, cap=False), ex)
    a = Request(0, 4, 3, prompt_token_ids=[1, 2, 3, 4])
    eng.add_request(a)
    eng.step()
    out = eng.step()
    assert out.num_new_tokens == [2] and out.new_token_ids(0) == [100, 101]
    assert a.output_token_ids == [7, 100, 101] and a.finish_reason == "length"
    assert out.finished == [a] and eng.block_manager.num_used_blocks == 0


def test_eos_inside_the_accepted_run_stops_there():
    ex = ScriptedExecutor(accept=3, token=7)
    eng = make_engine(FixedDrafter(3), ex)
    # 101 is the model's second end-of-sequence id: any of them stops a request.
    a = Request(0, 4, 20, prompt_token_ids=[1, 2, 3, 4], eos_token_ids=(999, 101),
                sampling=SamplingParams(ignore_eos=False))
    eng.add_request(a)
    eng.step()
    out = eng.step()
    # Drafts 100, 101 (an EOS), 102 all accepted: the request stops at the EOS draft.
    assert a.output_token_ids == [7, 100, 101] and a.finish_reason == "stop"
    assert out.num_new_tokens == [2] and a.status == RequestStatus.FINISHED


def test_a_stop_token_id_inside_the_accepted_run_stops_there_ignore_eos_or_not():
    """vLLM's stop_token_ids: the request's own stop ids end it whether or not it ignores the
    model's EOS (the server's default ignores it)."""
    ex = ScriptedExecutor(accept=3, token=7)
    eng = make_engine(FixedDrafter(3), ex)
    a = Request(0, 4, 20, prompt_token_ids=[1, 2, 3, 4], eos_token_ids=(100,),
                sampling=SamplingParams(stop_token_ids=frozenset({101})))
    eng.add_request(a)
    eng.step()
    out = eng.step()
    # Draft 100 is the model's EOS, ignored; 101 is a stop id: the run stops there.
    assert a.output_token_ids == [7, 100, 101] and a.finish_reason == "stop"
    assert out.num_new_tokens == [2] and a.status == RequestStatus.FINISHED


# ---- the simulator -----------------------------------------------------------------------------
def test_verifying_three_drafts_at_batch_one_costs_about_a_decode():
    # H200, llama-3-8b, one request with 1000 tokens of KV: a decode reads ~15 GB of weights
    # and 1001 keys; verifying 3 drafts adds 3 rows: 3 more keys read and written, 3 rows of
    # activations and logits, 4x the GEMM FLOPs (still far below the ridge point).
    cm = CostModel(get_model_config("llama-3-8b"), "bf16", get_gpu_spec("h200"))
    r = Request(0, 1000, 100)
    r.num_computed_tokens = 1000
    r.num_output_tokens = 1
    plain = SchedulerOutput([r], [1], 1, 0, 2048)
    r2 = Request(1, 1000, 100)
    r2.num_computed_tokens, r2.num_output_tokens = 1000, 1
    r2.spec_token_ids = [0, 0, 0]
    verify = SchedulerOutput([r2], [4], 1, 0, 2048, num_drafts=1, num_draft_tokens=3)
    shape = BatchShape.from_scheduler_output(verify)
    # Rows attend 1001, 1002, 1003, 1004 keys; one read of 1004 keys; 4 sampled rows.
    assert shape.attn_key_pairs == 1001 + 1002 + 1003 + 1004
    assert shape.attn_keys_read == 1004 and shape.num_logits == 4 and shape.num_tokens == 4
    a, b = cm.iteration_cost(plain), cm.iteration_cost(verify)
    assert b.time_s / a.time_s == pytest.approx(1.0, abs=0.01)
    assert b.flops / a.flops == pytest.approx(4.0, rel=0.01)
    # Per extra row, by hand (bf16, 32 layers, hidden 4096, q 4096, kv 1024, MLP 14336,
    # vocab 128256): GEMM activations (10240 + 8192 + 32768 + 18432) * 2 * 32 = 4,456,448;
    # q and o 2 * 4096 * 2 * 32 = 524,288; its KV write 131,072; elementwise
    # 8 * 4096 * 2 * 32 = 2,097,152; embedding 8,192; fp32 logits 513,024: 7,730,176 bytes.
    # Plus 3 more keys read (131,072 each): 23,583,744 bytes on ~15.1 GB.
    assert b.bytes - a.bytes == 3 * 7_730_176 + 3 * 131_072


def _sim_run(tmp_path, *flags) -> dict:
    from typer.testing import CliRunner

    from cbbench.cli.app import app

    wl = tmp_path / "wl.jsonl"
    rng = random.Random(3)
    wl.write_text("".join(
        json.dumps({"prompt_len": rng.randint(20, 400), "output_len": 400}) + "\n"
        for _ in range(40)
    ))  # fmt: skip
    out = tmp_path / f"r{len(flags)}.json"
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--workload", str(wl),
                                   "--request-rate", "inf", "--output", str(out), *flags])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_sim_run_reports_the_drawn_acceptance(tmp_path):
    r = _sim_run(tmp_path, "--speculative-tokens", "3", "--acceptance-rate", "0.7")
    spec = r["summary"]["speculative"]
    assert spec["source"] == "engine" and spec["speculative_tokens"] == 3
    its = r["iterations"]
    assert spec["draft_tokens"] == sum(i["draft_tokens"] for i in its) > 10_000
    # 40 x 399 decode tokens, nearly all verifying 3 drafts: the rates are the arithmetic's
    # (0.511, 2.533) within the sampling noise (a standard error of ~0.004) and the few
    # shorter drafts near each request's end.
    assert spec["acceptance_rate"] == pytest.approx(0.511, abs=0.02)
    assert spec["mean_acceptance_length"] == pytest.approx(2.533, abs=0.06)
    assert r["summary"]["engine"]["tokens_per_request_step"] == pytest.approx(2.5, abs=0.1)
    from cbbench.analysis.table import render_summary

    line = f"acceptance rate {spec['acceptance_rate']:.1%}, mean acceptance length"
    assert f"speculative decoding (engine, K=3): {line}" in render_summary(r)
    # Every output token is accounted for, and per request exactly its output length.
    assert sum(i["emitted_tokens"] for i in its) == 40 * 400
    assert all(q["output_tokens"] == 400 for q in r["requests"])


def test_sim_without_speculation_emits_one_token_per_request_step(tmp_path):
    r = _sim_run(tmp_path)
    assert "speculative" not in r["summary"]
    assert r["summary"]["engine"]["tokens_per_request_step"] == 1.0
    assert all(i["draft_tokens"] == 0 for i in r["iterations"])


# ---- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("run", ["--speculative-tokens", "17"], "--speculative-tokens must be in [0, 16], got 17"),
        ("run", ["--speculative-tokens", "-1"], "--speculative-tokens must be in [0, 16], got -1"),
        ("serve", ["--speculative-tokens", "99"], "--speculative-tokens must be in [0, 16]"),
        ("run", ["--speculative-tokens", "2", "--acceptance-rate", "1.5"],
         "--acceptance-rate must be in [0, 1], got 1.5"),
        ("run", ["--acceptance-rate", "0.5"], "--acceptance-rate needs --speculative-tokens"),
    ],
)
def test_bad_speculation_options_are_one_line_exit_2(tmp_path, command, flags, message):
    from helpers import cli_in_process

    out = tmp_path / "r.json"
    extra = ["--num-requests", "2", "--output", str(out)] if command == "run" else []
    # The console script's entry in this process (its exit status and stderr as a process's):
    # the one-line refusal is the point, not a second interpreter's start-up.
    proc = cli_in_process([command, "--engine", "sim", *flags, *extra])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: ") and message in lines[0]
    assert not out.exists()  # nothing ran


# ---- a property: random workloads to completion with speculation ----------------------------------
class CheckingExecutor:
    """Checks each plan against speculation's rules, then accepts a random number of drafts."""

    def __init__(self, engine_ref: list, seed: int) -> None:
        self.engine_ref, self.rng = engine_ref, random.Random(seed)

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        eng = self.engine_ref[0]
        s, bm = eng.scheduler, eng.block_manager
        assert sched.total_tokens == sum(sched.num_scheduled_tokens)
        assert sched.total_tokens <= s.config.max_num_batched_tokens
        nd = sched.num_decode_reqs
        drafts = 0
        for i, (r, n) in enumerate(zip(sched.scheduled_reqs, sched.num_scheduled_tokens)):
            d = len(r.spec_token_ids)
            if i < nd:
                assert n == 1 + d and r.num_tokens - r.num_computed_tokens == 1
                assert r.num_output_tokens + 1 + d <= r.max_tokens  # never past the budget
            else:
                assert d == 0  # only decodes verify drafts
            drafts += d
            assert len(r.block_table) * bm.block_size >= r.num_computed_tokens + n
        assert drafts == sched.num_draft_tokens
        assert sched.num_drafts == sum(1 for r in sched.scheduled_reqs[:nd] if r.spec_token_ids)
        for r in sched.preempted:
            assert r.spec_token_ids == [] and r not in sched.scheduled_reqs
        bm.check_invariants(list(s.running) + list(s.waiting))
        accepted = [self.rng.randint(0, len(r.spec_token_ids)) for r in sched.scheduled_reqs]
        return ExecutorOutput(None, duration_s=1e-3, num_accepted=accepted)


_shapes = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 30)), min_size=1, max_size=12)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=_shapes,
    k=st.integers(1, 6),
    budget=st.integers(8, 64),
    num_blocks=st.integers(12, 60),
    policy=st.sampled_from(["fcfs", "priority"]),
    allocation=st.sampled_from(["paged", "reserved"]),
    caching=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_speculation_keeps_every_rule_and_exact_output_lengths(
    shapes, k, budget, num_blocks, policy, allocation, caching, seed
):
    ref: list = []
    config = EngineConfig(
        SchedulerConfig(max_model_len=4096, max_num_batched_tokens=budget, queue_policy=policy),
        num_blocks, 4, allocation, enable_prefix_caching=caching,
    )  # fmt: skip
    eng = Engine(config, CheckingExecutor(ref, seed), VirtualClock(), drafter=FixedDrafter(k))
    ref.append(eng)
    rng = random.Random(seed)
    # Staggered arrivals with mixed priorities: later, more urgent requests preempt running
    # ones, verifiers included.
    times = sorted(rng.choice([0.0, 0.002, 0.005, 0.01]) for _ in shapes)
    # Prompt ids from a shared stem, so prefix caching finds hits.
    stem = [rng.randrange(8) for _ in range(40)]
    reqs = [Request(i, p, o, arrival_time=t, priority=rng.randint(0, 2),
                    prompt_token_ids=stem[:p] if caching else None)
            for i, ((p, o), t) in enumerate(zip(shapes, times))]  # fmt: skip
    run_until_done(eng, reqs)
    for r in reqs:
        if r.status == RequestStatus.REJECTED:
            continue
        assert r.status == RequestStatus.FINISHED and r.num_output_tokens == r.max_tokens
        assert len(r.token_times) == r.max_tokens and r.token_times == sorted(r.token_times)
    bm = eng.block_manager
    bm.check_invariants([])
    assert bm.num_free_blocks == num_blocks
    emitted = sum(rec.emitted_tokens for rec in eng.records)
    assert emitted == sum(r.max_tokens for r in reqs if r.status == RequestStatus.FINISHED)
