"""The bundled simulator as a target, run by the array simulator into a CompactRun.

The same engines as targets/engine.run_engine builds (one replica, or a ReplicaSet's), the same
requests in the same order, run by engine/sim/array_sim.py instead of the objects' loop: for
runs of 10^5-10^6 requests, where the object path's time and memory grow past what a laptop
has. ``run_engine_compact`` returns None where the array simulator does not model the run
(before it starts, or at a step that would preempt); the caller then runs the object path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from cbbench.analysis.compact.compact_run import CompactRequests, CompactRun, StepTable
from cbbench.engine.args import EngineArgs
from cbbench.load.workload_types import WorkloadRequest

log = logging.getLogger("cbbench")

# Below this many requests the object path is fast enough and keeps every record as objects
# (the views that read a RequestRecord's token list need no columns). Tests lower it.
COMPACT_MIN_REQUESTS = 50_000


def compact_unsupported(opts: EngineArgs, wreqs: list[WorkloadRequest], *, sessions=None,
                        cancel=None, step_time_factors=None) -> str | None:
    """Why this run needs the object path, or None."""
    from cbbench.engine.build import resolve_engine
    from cbbench.engine.sim.array_sim import unsupported

    if resolve_engine(opts) != "sim":
        return "not the simulator"
    if sessions is not None:
        return "a session workload"
    if cancel is not None:
        return "--cancel-rate"
    if step_time_factors is not None or opts.gpu_profile is not None:
        return "a device profile"
    if any(w.reasoning_len for w in wreqs):
        return "reasoning splits"
    return unsupported(opts)


def run_engine_compact(
    opts: EngineArgs,
    wreqs: list[WorkloadRequest],
    arrivals: np.ndarray,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    grace_s: float = 10.0,
    live=None,
) -> CompactRun | None:
    """``live``: a LiveBoard (targets/live.py) the array simulator feeds."""
    from cbbench.engine.sim.array_sim import ArraySim, NeedsStepping

    from .engine import build_engine, build_replicas

    dp = opts.data_parallel_size > 1
    built, info = build_replicas(opts) if dp else build_engine(opts)
    engines = built.engines if dp else [built]
    order = np.argsort(np.asarray(arrivals, dtype=np.float64), kind="stable")
    prompt = [wreqs[k].prompt_len for k in order]
    max_tokens = [wreqs[k].output_len for k in order]
    arrival = [float(arrivals[k]) for k in order]
    total = len(prompt)
    try:
        sim = ArraySim(engines, opts.router, prompt, max_tokens, arrival)
        if live is not None:
            live.attach_array_sim(sim)
        progress = (lambda done: on_progress(done, total)) if on_progress is not None else None
        completed_all = sim.run(should_stop, progress)
        if not completed_all:
            sim.drain(grace_s)
    except NeedsStepping as e:
        log.info(f"the array simulator stepped back to the engine's objects ({e})")
        return None
    return _compact_run(sim, order, wreqs, info, completed_all, dp)


def _compact_run(sim, order: np.ndarray, wreqs: list[WorkloadRequest], info,
                 completed_all: bool, dp: bool) -> CompactRun:
    """The run as columns: requests in arrival order (those that never arrived left out, as
    the object path counts them not sent)."""
    n = sim.arrived if not completed_all else len(order)
    keep = slice(0, n)
    first_step = np.frombuffer(sim.first_step, dtype=np.int64)[keep].copy()
    # A finished request has its whole length; one rejected, queued or in its prefill when it
    # ended has no token; one aborted mid-decode has the tokens it had.
    max_tokens = np.array(sim.max_tokens[:n], dtype=np.int64)
    out = max_tokens.copy()
    out[first_step < 0] = 0
    for i, tokens in sim.tokens_at_abort.items():
        out[i] = tokens
    requests = CompactRequests(
        id=np.array([wreqs[k].id for k in order[keep]], dtype=np.int64),
        prompt_tokens=np.array(sim.prompt[:n], dtype=np.int64),
        output_tokens=out,
        max_tokens=max_tokens,
        arrival_s=np.array(sim.arrival[:n], dtype=np.float64),
        first_scheduled_s=np.frombuffer(sim.first_scheduled, dtype=np.float64)[keep].copy(),
        replica=np.frombuffer(sim.replica_of, dtype=np.int64)[keep].copy(),
        first_step=first_step,
        priority=np.array([wreqs[k].priority for k in order[keep]], dtype=np.int64),
        errors={i: e for i, e in sim.errors.items() if i < n},
    )
    cols, ends = sim.step_columns(replica_field=dp)
    end = sim.now()
    duration = sim.last_finish if completed_all else end
    if not np.isfinite(duration):
        duration = 0.0
    return CompactRun(
        requests=requests, replica_end_s=ends, steps=StepTable(cols), duration_s=duration,
        interrupted=not completed_all, resolved=info, not_sent=len(order) - n,
        kv_blocks_in_use_at_end=sum(r.used for r in sim.replicas),
    )
