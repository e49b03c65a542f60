"""Fast-forward: a stretch of pure-decode iterations advanced in one move.

While a simulated engine has only decode rows running, nothing waiting, and no arrival,
finish, preemption or chunk boundary ahead, each iteration is the last one with every row's
context one token longer: its batch shape, hence its time, has a closed form (decode keys
grow by one per row per step), and so do its records. This module computes such a stretch
without the scheduler and the per-row post-processing, and leaves the engine exactly as
stepping would: the same clock, the same token times, the same block tables (blocks taken at
the same steps in the same order), the same iteration records. ``--no-fast-forward`` steps
every iteration (the reference, tests/engine/test_sim_scale.py holds the two equal).

The stretch ends before the step in which a row would finish (that step is stepped: a finish
changes the batch), before a step whose start is not before ``horizon`` (the next arrival or
abort: the loop fires it first), and before a step that would find the KV pool short (it
would preempt).
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.clock import VirtualClock
from ..core.engine import Engine, StepOutput
from ..core.iteration import IterationRecord
from ..core.scheduler_output import SchedulerOutput
from .cost_model import BatchShape
from .sim_executor import SimExecutor

MIN_STRETCH = 2  # fewer steps than this are not worth the set-up


def eligible(engine: Engine) -> bool:
    """A simulated engine on a virtual clock whose scheduler will step decodes alone."""
    if type(engine.executor) is not SimExecutor or not isinstance(engine.clock, VirtualClock):
        return False
    return engine.scheduler.decode_only()


def _room_for_two_steps(engine: Engine, now: float, horizon: float) -> bool:
    """Whether a second step could start before ``horizon``: no step is shorter than the cost
    model's floor. Checked first, as it costs nothing per row: under dense arrivals (400 req/s
    over 8 replicas) the next arrival is nearly always within one step, and a one-step stretch
    is just a step (the stepped path takes it)."""
    cost_model = getattr(engine.executor, "cost_model", None)
    floor = cost_model.min_step_s() if cost_model is not None else None
    return now + (floor or 0.0) < horizon


def fast_forward(engine: Engine, horizon: float,
                 on_step: Callable[[StepOutput], None] | None = None) -> int:
    """Advance ``engine`` through the pure-decode steps that start before ``horizon``, as
    stepping would; returns how many (0: not a stretch, step normally)."""
    clock = engine.clock
    if engine.scheduler.waiting or not _room_for_two_steps(engine, clock.now(), horizon):
        return 0
    if not eligible(engine):
        return 0
    running = list(engine.scheduler.running)
    k_max = min(r.max_tokens - r.num_output_tokens for r in running) - 1
    if k_max < MIN_STRETCH:
        return 0
    bm = engine.block_manager
    bs = bm.block_size
    n = len(running)
    # Which rows take a new block at which step of the stretch (paged: when the row's next
    # token starts a block), in running order, as the scheduler's decode loop allocates.
    crossings: dict[int, list] = {}
    if not bm.reserved:
        for r in running:
            s = len(r.block_table) * bs - r.num_computed_tokens
            while s < k_max:
                if s >= 0:
                    crossings.setdefault(s, []).append(r)
                s += bs
    executor = engine.executor
    assert isinstance(executor, SimExecutor)  # eligible() checked it
    cost_model = executor.cost_model
    budget = engine.scheduler.config.max_num_batched_tokens
    total_blocks = bm.num_blocks
    dec_keys = sum(r.num_computed_tokens for r in running) + n
    sched = SchedulerOutput(running, [1] * n, n, 0, budget)
    times: list[float] = []
    for j in range(k_max):
        start = clock.now()
        if start >= horizon:
            break
        grow = crossings.get(j)
        if grow:
            if len(grow) > bm.num_free_blocks:
                break  # the stepped path would preempt here
            for r in grow:
                ok = bm.allocate(r, r.num_computed_tokens + j + 1)
                assert ok
        keys = float(dec_keys + j * n)
        cost = cost_model.cost(BatchShape(n, n, keys, keys, n, 0, keys))
        assert cost.time_s is not None  # a simulated executor has rates
        clock.advance_to(start + cost.time_s)
        end = clock.now()
        times.append(end)
        record = IterationRecord(
            engine.num_records, start, end - start, 0, n, budget, 0, n, n, 0, 0,
            bm.num_used_blocks, total_blocks, cost.bytes, cost.flops,
            predicted_s=cost.time_s, num_logits=n, attn_key_pairs=keys, attn_keys_read=keys,
            attn_decode_keys=keys, emitted_tokens=n, num_sampled_reqs=n,
        )
        engine.append_record(record)
        if on_step is not None:
            on_step(StepOutput(record, sched, []))
    k = len(times)
    for r in running:
        r.num_computed_tokens += k
        r.num_output_tokens += k
        r.token_times.extend(times)
    return k
