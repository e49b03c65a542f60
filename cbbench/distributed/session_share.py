"""Multi-turn sessions across workers.

A session never spans workers: each turn carries the replies of the turns before it (only the
worker that read them has them), and a session's turns share one growing prefix in the
server's cache. So whole sessions are dealt in turn (deal(), keyed by session), and each
worker runs the run's SessionPlan with its own sessions active: request ids, labels, think
times and cancellations are drawn per (seed, session position, turn), the same as in one
process.

A worker that dies leaves, per session, the turns it did not report. One whose every awaited
turn was reported (and did not fail) may have been in flight: it was due at its session's start
(turn 1) or at the end of those turns plus its wait; due before the death, it is lost (a failed
record, as for a plain request); otherwise it, and every turn waiting on an unreported one, was
not sent. (A session without sub-agents has at most one such turn: the first unreported.)
Its sessions that had started and have turns not sent ended early, as one process counts a
session a failed turn cut short (the worker's own count died with it: it sent no Done).
"""

from __future__ import annotations

from collections.abc import Sequence

from cbbench.analysis.records import RequestRecord
from cbbench.distributed.plan import deal
from cbbench.load.session_plan import SessionPlan
from cbbench.load.sessions import first_prompt_len, next_prompt_len


def deal_sessions(plan: SessionPlan, num_workers: int, max_concurrency: int | None = None
                  ) -> tuple[list[list[int]], list[list[int]]]:
    """(each worker's request ids, each worker's session positions); under a cap, sessions
    in proportion to each worker's slots (plan.deal)."""
    owner = plan.session_of()
    shares = deal(plan.num_turns, num_workers, owner, max_concurrency)
    return shares, [sorted({owner[p] for p in share}) for share in shares]


def _turn_end_s(rec: RequestRecord) -> float:
    """When a reported turn ended, as far as its record tells: its last token, else its send.
    The session's next turn went out a think time after its true end, which is no earlier:
    a turn near the death is counted lost rather than not sent, never the other way."""
    if rec.token_times_s:
        return rec.token_times_s[-1]
    return rec.send_s if rec.send_s is not None else rec.intended_start_s


def lost_turns(
    plan: SessionPlan,
    sessions: Sequence[int],
    records: Sequence[RequestRecord | None],
    died_at_s: float,
    error: str,
    error_type: str,
    worker: int,
) -> tuple[list[RequestRecord], int]:
    """A dead worker's unreported turns: (failed records for those due before it died, the
    number of turns not sent)."""
    lost: list[RequestRecord] = []
    not_sent = 0
    for i in sessions:
        session = plan.sessions[i]
        turns = session.all_turns
        for k, (turn, node) in enumerate(zip(turns, session.nodes)):
            pos = plan.request_id(i, k)
            if records[pos] is not None:
                continue
            waits = [records[plan.request_id(i, w)] for w in node.waits_on]
            if k == 0:
                due, prompt = float(plan.starts[i]), first_prompt_len(turn.user_len)
            elif all(w is not None and w.error is None for w in waits):
                # completed or cancelled: the session went on
                due = max(_turn_end_s(w) for w in waits if w is not None) + plan.think_time_s(i, k)
                before = records[plan.request_id(i, node.prev)] if node.prev is not None else None
                prompt = (first_prompt_len(turn.user_len) if before is None else
                          next_prompt_len(before.prompt_tokens, before.output_tokens, turn.user_len))
            else:  # a turn it waits on failed or was never sent: it was not sent either
                due = None
            if due is not None and due <= died_at_s:
                lost.append(RequestRecord(
                    id=pos, prompt_tokens=prompt, output_tokens=0, intended_start_s=due,
                    error=error, error_type=error_type, session_id=plan.labels[i],
                    turn=node.index + 1, max_tokens=turn.output_len, worker=worker,
                    turn_kind=turn.kind, agent=session.agent_name(k),
                ))
            else:
                not_sent += 1
    return lost, not_sent


def cut_short(plan: SessionPlan, sessions: Sequence[int],
              records: Sequence[RequestRecord | None]) -> int:
    """How many of a dead worker's sessions (``records`` filled by lost_turns) started and
    then had turns not sent: cut short by a failed turn or by the death (which fails the
    turn in flight, or the one due next)."""
    count = 0
    for i in sessions:
        ids = [plan.request_id(i, k) for k in range(len(plan.sessions[i].all_turns))]
        sent = sum(records[p] is not None for p in ids)
        count += 0 < sent < len(ids)
    return count
