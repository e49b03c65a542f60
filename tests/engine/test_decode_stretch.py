"""The decode stretch (Scheduler.decode_stretch, advanced by Engine.fast_forward) against
stepping, where it is hardest: a KV pool so small that stretches end on a block shortage and
the stepped run preempts. Every step's block tables (the blocks taken at the same steps, in
the same order), every record and every token time identical; and an executor that is not
the simulator's own (a profile's scaled steps) is always stepped.
"""

from __future__ import annotations

import pytest

from cbbench.engine.args import EngineArgs
from cbbench.engine.build_sim import build_sim_engine
from cbbench.engine.core.engine import Engine
from cbbench.engine.core.feed import run_until_done
from cbbench.engine.core.request import Request
from cbbench.engine.core.scheduler import DecodeStretch

# 24 requests of 40-70 prompt tokens and 30-89 output tokens, 0.5 ms apart, on 60 blocks of
# 16 tokens: the decodes outgrow the pool, so the stepped run preempts.
NUM_REQUESTS, NUM_KV_BLOCKS = 24, 60


def _requests() -> list[Request]:
    return [Request(i, 40 + (7 * i) % 31, 30 + (13 * i) % 60, arrival_time=i * 5e-4)
            for i in range(NUM_REQUESTS)]


def _run(fast_forward: bool, scaled: bool = False):
    args = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", block_size=16,
                      num_kv_blocks=NUM_KV_BLOCKS, fast_forward=fast_forward)
    engine, _ = build_sim_engine(args)
    if scaled:  # what cbbench/targets/engine.py does with a profile's step-time factors
        from cbbench.engine.sim.sim_bounds import ScaledExecutor

        engine.executor = ScaledExecutor(engine.executor, {"decode": 1.25})
    tables: list[list[tuple[int, tuple[int, ...]]]] = []

    def on_step(step) -> None:
        tables.append([(r.request_id, tuple(r.block_table))
                       for r in step.scheduled.scheduled_reqs])

    reqs = _requests()
    assert run_until_done(engine, reqs, on_step=on_step)
    return engine, reqs, tables


@pytest.fixture(scope="module")
def counted():
    """Steps each stretch advanced, and the stretches a block shortage ended, in a
    fast-forwarded run."""
    stretches: list[int] = []
    short: list[int] = []
    real_ff, real_take = Engine.fast_forward, DecodeStretch.take_blocks

    def ff(self, *a, **kw):
        k = real_ff(self, *a, **kw)
        if k:
            stretches.append(k)
        return k

    def take(self, j):
        ok = real_take(self, j)
        if not ok:
            short.append(j)
        return ok

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "fast_forward", ff)
        mp.setattr(DecodeStretch, "take_blocks", take)
        stepped = _run(False)
        assert not stretches and not short  # --no-fast-forward never asks
        fast = _run(True)
        scaled_stepped = _run(False, scaled=True)
        n_before = len(stretches)
        scaled_fast = _run(True, scaled=True)
        scaled_stretches = len(stretches) - n_before
    return stepped, fast, stretches, short, scaled_stepped, scaled_fast, scaled_stretches


def test_stretches_through_a_block_shortage_equal_the_steps(counted):
    (e_step, r_step, t_step), (e_fast, r_fast, t_fast), stretches, short = counted[:4]
    assert sum(rec.num_preempted for rec in e_step.records) > 0  # the pool was short
    assert stretches and sum(stretches) > 0.2 * len(e_fast.records)  # stretches were taken
    assert short  # and at least one ended where the next step would preempt
    assert t_fast == t_step  # every step's rows and block tables
    assert e_fast.records == e_step.records
    assert [r.token_times for r in r_fast] == [r.token_times for r in r_step]
    assert [r.num_preemptions for r in r_fast] == [r.num_preemptions for r in r_step]


def test_a_scaled_executor_is_stepped(counted):
    (e_step, r_step, t_step), (e_fast, r_fast, t_fast) = counted[4:6]
    assert counted[6] == 0  # fast_forward found the executor was not the simulator's own
    assert e_fast.records == e_step.records
    assert [r.token_times for r in r_fast] == [r.token_times for r in r_step]
    # The factor did apply: the decode steps are slower than the unscaled run's.
    assert e_step.records[-1].start_s > counted[0][0].records[-1].start_s
