"""A compact run's rows for the result file: each request as runner.request_record_dict
gives it for the same run's RequestRecord, and each iteration as the object path writes it
(IterationRecord.to_dict, with metrics.add_utilization's MBU and MFU)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from cbbench.analysis.compact.compact_run import CompactRun
from cbbench.analysis.compact.compact_summary import compact_columns
from cbbench.analysis.summary.columns import RequestColumns
from cbbench.analysis.summary.metrics import MS, add_utilization, gpu_of


def _nullable(a: np.ndarray) -> list:
    return [None if math.isnan(v) else v for v in a.tolist()]


def compact_request_dicts(run: CompactRun, detailed: bool,
                          view: RequestColumns | None = None) -> Iterator[dict]:
    """The result's ``requests`` rows, in the run's order. In-process: the send is the
    intended start (no lag), no preemption (the layout's premise), no reasoning, cached
    tokens or token ids. ``view``: the summary's, if it is at hand (saves ~0.3 s at 1M)."""
    view = view if view is not None else compact_columns(run)
    req = run.requests
    ok = view.ok
    ttft = _nullable(np.where(ok, view.ttft_ms, np.nan))
    tpot = _nullable(np.where(view.has_tpot, view.tpot_ms, np.nan))
    e2el = _nullable(np.where(ok, view.e2el_ms, np.nan))
    queue = _nullable((req.first_scheduled_s - req.arrival_s) * MS)
    lag = ((req.arrival_s - req.arrival_s) * MS).tolist()
    columns = zip(req.id.tolist(), req.prompt_tokens.tolist(), req.output_tokens.tolist(),
                  ttft, tpot, e2el, req.arrival_s.tolist(), lag, req.priority.tolist(),
                  queue, req.max_tokens.tolist())
    for i, (rid, prompt, out, t1, tp, e2, start, sl, prio, q, mt) in enumerate(columns):
        error, error_type = req.errors.get(i, (None, None))
        d = {
            "id": rid, "prompt_tokens": prompt, "output_tokens": out,
            "ttft_ms": t1, "tpot_ms": tp, "e2el_ms": e2,
            "error": error, "cancelled": False, "error_type": error_type,
            "intended_start_s": start, "send_lag_ms": sl, "num_preemptions": 0,
            "priority": prio, "ttfot_ms": t1, "reasoning_tokens": None, "cached_tokens": None,
        }
        if q is not None:
            d["queue_ms"] = q
        d["max_tokens"] = mt
        if detailed:
            times = req.token_times(i, run.replica_end_s)
            d["token_times_s"] = times.tolist()
            d["send_s"] = start
            d["first_output_s"] = None
            d["itl_ms"] = (np.diff(times) * MS).tolist()
        yield d


def compact_iteration_dicts(run: CompactRun) -> Iterator[dict]:
    """The result's ``iterations`` rows: StepTable.dicts(), with MBU and MFU where the GPU
    is known (as the object path's dicts: metrics.add_utilization)."""
    gpu = gpu_of(run.resolved.gpu_spec)
    for it in run.steps.dicts():
        if gpu is not None:
            add_utilization(it, gpu, run.resolved.dtype)
        yield it
