"""Multi-turn metrics: latency by turn index, and per session.

A turn's prompt holds the whole history, so later turns prefill more (or, with a prefix cache,
reuse more): TTFT by turn shows which. ``by_turn`` follows the run summary's definitions
(completed requests only, vLLM's TTFT and TPOT); ``session_summary`` looks at each session as a
user would: how long it took, and how long its replies took to start.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.server_cache import reporting_endpoints, server_prefix_cache
from cbbench.analysis.summary.columns import NO_TURN, RequestColumns, as_columns
from cbbench.analysis.summary.metrics import DEFAULT_PERCENTILES, MS, distribution

# The records' turn kinds (load/sessions.py writes them; analysis reads records only).
TOOL_KIND = "tool"
SUBAGENT_KIND = "subagent"  # ttft_by_turn_kind_ms: any turn of a sub-agent (load/session_dag.py)


def by_turn(run: RequestColumns | Sequence[RequestRecord],
            percentiles=DEFAULT_PERCENTILES) -> list[dict]:
    """[{"turn": k, "completed", "failed", "mean_prompt_tokens", "ttft_ms", "tpot_ms"}, ...]
    for every turn index present, in order (turns count from 1)."""
    cols = as_columns(run)
    records = cols.records
    turns = np.unique(cols.turn[cols.turn != NO_TURN])
    # The run's, not each turn's: a turn where nothing hit may carry no cached_tokens (vLLM).
    reporting = reporting_endpoints(records) if records is not None else set()
    out = []
    for k in turns.tolist():
        mine = cols.turn == k
        done = mine & cols.ok
        rows = np.flatnonzero(done)
        out.append({
            "turn": k,
            "completed": len(rows),
            "failed": int((mine & cols.failed).sum()),
            "mean_prompt_tokens": float(np.mean(cols.prompt_tokens[rows])) if len(rows) else None,
            "ttft_ms": distribution(cols.ttft_ms[rows], percentiles),
            "tpot_ms": distribution(cols.tpot_ms[done & cols.has_tpot], percentiles),
            # The server's prefix-cache hits on this turn (None: it reported none).
            "server_prefix_cache": (
                server_prefix_cache([records[i] for i in rows.tolist()], reporting)
                if records is not None else None),
        })
    return out


def session_summary(
    records: Sequence[RequestRecord], planned_turns: dict, ended_early: int,
    percentiles=DEFAULT_PERCENTILES,
) -> dict:
    """Per-session figures. ``planned_turns``: session id -> its number of turns. A session is
    completed when every planned turn completed; its duration runs from its first turn's
    intended start to its last token."""
    by_session: dict = {}
    for r in records:
        if r.session_id is not None:
            by_session.setdefault(r.session_id, []).append(r)
    completed = []
    mean_ttft = []
    in_tools, in_model, in_subagents = [], [], []
    for sid, recs in by_session.items():
        done = [r for r in recs if r.ok]
        if done:
            mean_ttft.append(float(np.mean([r.ttft_s for r in done])) * MS)
        if len(done) == planned_turns.get(sid, -1):
            start = min(r.intended_start_s for r in recs)
            completed.append(max(r.token_times_s[-1] for r in done) - start)
            tools, model, subagents = _wall_time_split(done)
            in_tools.append(tools)
            in_model.append(model)
            in_subagents.append(subagents)
    kinds = sorted({k for r in records if r.turn_kind is not None and (k := _kind(r)) is not None})
    by_kind = {
        k: distribution([(r.token_times_s[0] - r.intended_start_s) * MS  # TTFT
                         for r in records if r.ok and _kind(r) == k], percentiles)
        for k in kinds
    }
    return {
        "count": len(planned_turns),
        "started": len(by_session),
        "completed": len(completed),
        "ended_early": ended_early,
        "turns_planned": int(sum(planned_turns.values())),
        "turns_sent": sum(len(v) for v in by_session.values()),
        "duration_s": distribution(completed, percentiles),
        "mean_ttft_ms": distribution(mean_ttft, percentiles),
        # Completed sessions, on the wall clock (a session with sub-agents runs turns in
        # parallel): time in the model is when at least one of its turns was in the model
        # (from a turn's intended start to its last token); time in tools when at least one
        # tool was running (a tool turn's wait) and no turn was in the model; the rest of
        # duration_s is think time. time_in_subagents_s: when a sub-agent's turn was in the
        # model (part of time_in_model_s).
        "time_in_tools_s": distribution(in_tools, percentiles),
        "time_in_model_s": distribution(in_model, percentiles),
        "time_in_subagents_s": distribution(in_subagents, percentiles),
        "ttft_by_turn_kind_ms": by_kind,
    }


def _kind(r: RequestRecord) -> str | None:
    """A turn's kind for the summary: a sub-agent's turns are their own kind."""
    return SUBAGENT_KIND if r.agent is not None else r.turn_kind


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return float(sum(b - a for a, b in intervals))


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The length of union a outside union b (both sorted and disjoint)."""
    overlap = sum(max(0.0, min(x1, y1) - max(x0, y0)) for x0, x1 in a for y0, y1 in b)
    return _length(a) - overlap


def _wall_time_split(done: Sequence[RequestRecord]) -> tuple[float, float, float]:
    """(time in tools, in the model, in sub-agents) of one completed session."""
    model = _union([(r.intended_start_s, r.token_times_s[-1]) for r in done])
    subagents = _union([(r.intended_start_s, r.token_times_s[-1]) for r in done if r.agent])
    tools = _union([(_wait_start(r, done), r.intended_start_s)
                    for r in done if r.turn_kind == TOOL_KIND])
    return _minus(tools, model), _length(model), _length(subagents)


def _wait_start(r: RequestRecord, done: Sequence[RequestRecord]) -> float:
    """When a tool turn's wait began: as recorded, else (records made without it) the end of
    its agent's previous turn."""
    if r.waited_from_s is not None:
        return r.waited_from_s
    prev = [p for p in done if p.agent == r.agent and p.turn == (r.turn or 0) - 1]
    return prev[0].token_times_s[-1] if prev else r.intended_start_s
