"""Multi-turn metrics: latency by turn index, and per session.

A turn's prompt holds the whole history, so later turns prefill more (or, with a prefix cache,
reuse more): TTFT by turn shows which. ``by_turn`` follows the run summary's definitions
(completed requests only, vLLM's TTFT and TPOT); ``session_summary`` looks at each session as a
user would: how long it took, and how long its replies took to start.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cbbench.analysis.metrics import DEFAULT_PERCENTILES, MS, distribution
from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_cache import server_prefix_cache


def by_turn(records: Sequence[RequestRecord], percentiles=DEFAULT_PERCENTILES) -> list[dict]:
    """[{"turn": k, "completed", "failed", "mean_prompt_tokens", "ttft_ms", "tpot_ms"}, ...]
    for every turn index present, in order (turns count from 1)."""
    turns = sorted({r.turn for r in records if r.turn is not None})
    out = []
    for k in turns:
        mine = [r for r in records if r.turn == k]
        done = [r for r in mine if r.ok]
        out.append({
            "turn": k,
            "completed": len(done),
            "failed": sum(1 for r in mine if r.error is not None),
            "mean_prompt_tokens": (
                float(np.mean([r.prompt_tokens for r in done])) if done else None
            ),
            "ttft_ms": distribution([r.ttft_s * MS for r in done], percentiles),
            "tpot_ms": distribution(
                [r.tpot_s * MS for r in done if r.tpot_s is not None], percentiles
            ),
            # The server's prefix-cache hits on this turn (None: it reported none).
            "server_prefix_cache": server_prefix_cache(done),
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
    in_tools, in_model = [], []
    for sid, recs in by_session.items():
        done = [r for r in recs if r.ok]
        if done:
            mean_ttft.append(float(np.mean([r.ttft_s for r in done])) * MS)
        if len(done) == planned_turns.get(sid, -1):
            start = min(r.intended_start_s for r in recs)
            completed.append(max(r.token_times_s[-1] for r in done) - start)
            tools, model = _tool_and_model_time(done)
            in_tools.append(tools)
            in_model.append(model)
    kinds = sorted({r.turn_kind for r in records if r.turn_kind is not None})
    by_kind = {
        k: distribution([r.ttft_s * MS for r in records if r.ok and r.turn_kind == k],
                        percentiles)
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
        # Completed sessions: the end-to-end time split into waiting on tools (a tool turn's
        # latency: from the reply that asked for the call to the tool turn's intended start)
        # and in the model (each turn's intended start to its last token); the rest is the
        # user's think time.
        "time_in_tools_s": distribution(in_tools, percentiles),
        "time_in_model_s": distribution(in_model, percentiles),
        "ttft_by_turn_kind_ms": by_kind,
    }


def _tool_and_model_time(done: Sequence[RequestRecord]) -> tuple[float, float]:
    turns = sorted(done, key=lambda r: r.turn)
    tools = sum(
        r.intended_start_s - prev.token_times_s[-1]
        for prev, r in zip(turns, turns[1:]) if r.turn_kind == "tool"
    )
    model = sum(r.token_times_s[-1] - r.intended_start_s for r in turns)
    return float(tools), float(model)
