"""An object-path engine run (targets/engine.py's EngineRun) as a CompactRun: the reference
the array simulator's runs and the compact summary are checked against.

Per replica, the step end times are the sorted distinct token times of the requests it
served (a step that gave nobody a token is in nobody's slice, so leaving it out changes no
request's figures). Each request's token times must then be a contiguous run of them, one
token per step: checked here, and an error where it does not hold (a preempted request, a
step with two tokens of one request), as do the record fields the layout has no column for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from cbbench.analysis.compact.compact_run import CompactRequests, CompactRun, StepTable
from cbbench.analysis.records import RequestRecord
from cbbench.engine.core.iteration import FIELD_NAMES, PREEMPTED_PREFIX_FIELDS, IterationRecord

# Record fields with no column in the layout: each must hold its default.
_ABSENT = ("output_token_ids", "session_id", "turn", "slot_s", "event_tokens",
           "reasoning_tokens", "first_output_s", "cached_tokens")


def compact_from_engine_run(run, replica_of: dict[int, int] | None = None) -> CompactRun:
    """``run`` (an EngineRun) as columns. ``replica_of``: request id -> the replica that
    served it (ReplicaSet.assignments); None: one engine (replica 0)."""
    records = run.records
    for r in records:
        _check_record(r)
    replica = np.array([_replica(r, replica_of) for r in records], dtype=np.int64)
    steps = step_table(run.iterations)
    num_replicas = 1 + max(int(replica.max(initial=0)),
                           int(steps["replica"].max(initial=0)) if "replica" in steps.columns
                           else 0)
    ends = [np.unique(np.concatenate(
        [np.asarray(records[i].token_times_s, dtype=np.float64)
         for i in np.flatnonzero(replica == k)] + [np.zeros(0)]))
        for k in range(num_replicas)]
    first_step = np.array([_first_step(r, ends[k]) for r, k in zip(records, replica)],
                          dtype=np.int64)
    requests = CompactRequests(
        id=np.array([r.id for r in records], dtype=np.int64),
        prompt_tokens=np.array([r.prompt_tokens for r in records], dtype=np.int64),
        output_tokens=np.array([r.output_tokens for r in records], dtype=np.int64),
        max_tokens=np.array([r.max_tokens for r in records], dtype=np.int64),
        arrival_s=np.array([r.intended_start_s for r in records], dtype=np.float64),
        first_scheduled_s=np.array(
            [math.nan if r.first_scheduled_s is None else r.first_scheduled_s for r in records],
            dtype=np.float64),
        replica=replica,
        first_step=first_step,
        priority=np.array([r.priority for r in records], dtype=np.int64),
        errors={i: (r.error, r.error_type) for i, r in enumerate(records) if r.error is not None},
    )
    return CompactRun(requests, ends, steps, run.duration_s, run.interrupted, run.resolved,
                      not_sent=run.not_sent, kv_blocks_in_use_at_end=run.kv_blocks_in_use_at_end)


def step_table(iterations: Sequence[dict]) -> StepTable:
    """The iteration dicts as columns (``replica`` only where the records carry it; a
    missing prediction is NaN)."""
    # A resumed request's prefix lookups: none here (a preempted request has no compact form,
    # _check_record), and a record holds them only where there were some.
    names = [n for n in FIELD_NAMES if n not in ("replica", "pool", *PREEMPTED_PREFIX_FIELDS)]
    with_replica = sum(1 for it in iterations if "replica" in it)
    if with_replica:
        if with_replica < len(iterations):  # run_engine's drain after a stop steps each
            raise ValueError(  # replica's engine itself: those records carry no replica
                f"{len(iterations) - with_replica} of {len(iterations)} iteration records "
                "have no replica: a column cannot hold that")
        names.append("replica")
    if any("pool" in it for it in iterations):
        raise ValueError("a disaggregated run has no compact form (iteration pools)")
    cols = {}
    for n in names:
        values = [it[n] for it in iterations]
        if n == "predicted_s":
            values = [math.nan if v is None else v for v in values]
        cols[n] = np.array(values, dtype=_FLOAT_FIELDS.get(n, np.int64))
    return StepTable(cols)


# The record's float fields (the others are integers): a column keeps its field's type.
_FLOAT_FIELDS = {f.name: np.float64 for f in fields(IterationRecord) if "float" in str(f.type)}


def _replica(r: RequestRecord, replica_of: dict[int, int] | None) -> int:
    if replica_of is None:
        return 0
    if r.id not in replica_of:
        raise ValueError(f"request {r.id}: no replica assignment")
    return replica_of[r.id]


def _check_record(r: RequestRecord) -> None:
    held = [name for name in _ABSENT if getattr(r, name) is not None]
    if r.cancelled:
        held.append("cancelled")
    if r.num_preemptions:
        held.append("num_preemptions")
    if r.send_s != r.intended_start_s:
        held.append("send_s")
    if r.max_tokens is None:
        held.append("max_tokens (missing)")
    if held:
        raise ValueError(f"request {r.id}: the compact layout holds no {', '.join(held)}")
    if len(r.token_times_s) != r.output_tokens:
        raise ValueError(f"request {r.id}: {len(r.token_times_s)} token times for "
                         f"{r.output_tokens} output tokens")


def _first_step(r: RequestRecord, ends: np.ndarray) -> int:
    """The step of ``r``'s first token; its tokens must be that step and the next ones."""
    t = np.asarray(r.token_times_s, dtype=np.float64)
    if t.size == 0:
        return -1
    s = int(np.searchsorted(ends, t[0]))
    if not np.array_equal(ends[s:s + t.size], t):
        raise ValueError(f"request {r.id}: its token times are not consecutive steps of its "
                         "replica (one token per step, no gap)")
    return s
