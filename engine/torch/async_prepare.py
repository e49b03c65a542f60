"""Async scheduling's host side: step n+1's inputs prepared while step n runs on the device.

vLLM v1's async scheduling overlaps the host's work for the next step with the device's work on
this one; the sampled tokens of step n are the only thing step n+1's inputs need from it. Here
the scheduler still runs after step n's postprocess (so every scheduling decision, and every
iteration record, is exactly what it is without async), and what moves into the device's time is
the model runner's input preparation, the per-request pass that turns a schedule into packed
inputs (:class:`.input_batch.PersistentBatch`):

- while step n runs (between its launch and the sampled tokens' copy to the host), ``predict``
  builds step n+1's inputs for the schedule a pure-decode step leads to: the same requests in
  the same order, one token each, minus those that reach ``max_tokens`` now. Positions, lengths,
  ``cu_seqlens`` and the rows that will need a new KV block are worked out with numpy from step
  n's inputs;
- at step n+1, ``take`` checks the real schedule against the prediction (the same request
  objects in the same order, one token each, nothing swapped or preempted) and completes it:
  the sampled tokens become the input ids, the few rows that crossed into a new block get their
  block-table tail copied, and the slot mapping is read from the tables. Anything else (an EOS
  finish, an admission, a preemption, a prefill chunk) is a miss: the normal pass builds the
  inputs, so the result is always what it would have been.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.request import Request
from ..core.scheduler_output import SchedulerOutput
from .input_batch import HostInputs, PersistentBatch


@dataclass
class Prediction:
    reqs: list[Request]  # step n+1's requests, in order
    keep: np.ndarray  # int64 [R']: their rows in step n
    slots: np.ndarray  # int64 [R']
    positions: np.ndarray  # int64 [R']: the token each feeds
    seq_lens: np.ndarray  # int64 [R']
    grows: np.ndarray  # int64: indices (into R') of rows that need a block not yet copied


def predict(host: HostInputs, reqs: list[Request], batch: PersistentBatch) -> Prediction | None:
    """Step n+1's inputs as far as they do not depend on step n's tokens; None when step n is
    not a pure-decode step sampling every row (its successor is not predictable this way)."""
    n = host.num_reqs
    if not host.is_pure_decode or len(host.sample_req_indices) != n or n == 0:
        return None
    # Each request has produced one more token after this step; those at max_tokens finish.
    alive = [i for i in range(n) if reqs[i].num_output_tokens + 1 < reqs[i].max_tokens]
    if not alive:
        return None
    keep = np.asarray(alive, dtype=np.int64) if len(alive) < n else np.arange(n, dtype=np.int64)
    slots = host.sample_slots[keep]
    positions = host.positions[keep] + 1
    seq_lens = positions + 1
    grows = np.flatnonzero(seq_lens > batch._num_blocks_np[slots] * batch.block_size)
    next_reqs = reqs if len(alive) == n else [reqs[i] for i in alive]
    return Prediction(next_reqs, keep, slots, positions, seq_lens, grows)


def take(
    pred: Prediction | None, sched: SchedulerOutput, tokens: list[int] | None,
    batch: PersistentBatch,
) -> HostInputs | None:  # fmt: skip
    """Step n+1's inputs from the prediction, or None (a miss) when ``sched`` is not the
    predicted one. ``tokens``: step n's sampled tokens, by step n's row."""
    if pred is None or tokens is None:
        return None
    r = len(pred.reqs)
    if (sched.total_tokens != r or sched.num_decode_reqs != r or sched.preempted
            or sched.has_swaps or sched.scheduled_reqs != pred.reqs):  # fmt: skip
        return None
    bs = batch.block_size
    for i in pred.grows.tolist():  # the scheduler appended a block to these requests
        req = pred.reqs[i]
        slot = int(pred.slots[i])
        if len(req.block_table) * bs < int(pred.seq_lens[i]):
            return None  # cannot happen for a scheduled row; the normal pass will say why
        batch._sync_blocks(slot, req.block_table)
    positions, seq_lens, slots = pred.positions, pred.seq_lens, pred.slots
    input_ids = np.asarray(tokens, dtype=np.int64)
    if len(pred.keep) != len(tokens):
        input_ids = input_ids[pred.keep]
    cu_q = np.arange(r + 1, dtype=np.int32)
    every = np.arange(r, dtype=np.int64)  # one row per request, each sampled
    return batch.host_inputs(slots, input_ids, positions, slots, seq_lens, cu_q, 1, every,
                             every, seq_lens)
