"""Load for the in-process engine that depends on the engine: multi-turn sessions (turn k + 1
arrives a think time after turn k's reply finished) and cancellations (a request is aborted
some time after it was sent, unless it finished first).

The engine sees the same growing prompts a chat server would: with token ids (the torch engine,
or prefix caching), turn k + 1's prompt is turn k's prompt ids, then turn k's output ids as
generated, then the new message in the template (session_plan.py), so a prefix cache finds
everything turn k computed. The simulator samples lengths, not ids, so a session turn's reply
ids are scripted (drawn per turn): the cache then registers the reply's blocks as they are
computed, as a real engine registers what it generated.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from cbbench.engine.core.feed import ListFeed
from cbbench.engine.core.request import Request, RequestStatus
from cbbench.load.cancel import CancelPlan
from cbbench.load.session_plan import SessionPlan
from cbbench.load.sessions import first_prompt_len, next_prompt_len

# (request id, prompt_len, output_len, arrival time, prompt ids or None) -> Request
MakeRequest = Callable[[int, int, int, float, "list[int] | None"], Request]


class CancelTimer:
    """The aborts a CancelPlan schedules: each request it picks is aborted its delay after
    its arrival (when the engine target sends it), if it is still running or waiting then."""

    def __init__(self, plan: CancelPlan | None) -> None:
        self.plan = plan
        self._due: list[tuple[float, int, Request]] = []
        self.cancelled: set[int] = set()  # request ids aborted by the plan

    def arm(self, req: Request) -> None:
        if self.plan is None:
            return
        delay = self.plan.cancel_after_s(req.request_id)
        if delay is not None:
            heapq.heappush(self._due, (req.arrival_time + delay, req.request_id, req))

    def next_time(self) -> float | None:
        return self._due[0][0] if self._due else None

    def fire(self, engine, now: float) -> list[Request]:
        """Abort what is due; returns the requests aborted."""
        aborted = []
        while self._due and self._due[0][0] <= now:
            _, rid, req = heapq.heappop(self._due)
            if req.status.is_done:  # finished (or was rejected) first
                continue
            engine.abort_request(req)  # frees its KV blocks
            self.cancelled.add(rid)
            aborted.append(req)
        return aborted


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class CancellingListFeed(ListFeed):
    """engine/feed.ListFeed plus a CancelTimer: fixed arrivals, some of them cancelled."""

    def __init__(self, requests: list[Request], timer: CancelTimer) -> None:
        super().__init__(requests)
        self.timer = timer
        for req in requests:
            timer.arm(req)

    def next_time(self) -> float | None:
        return _earliest(super().next_time(), self.timer.next_time())

    def fire(self, engine, now: float) -> None:
        super().fire(engine, now)  # adds first: a delay of 0 cancels right after the send
        self.timer.fire(engine, now)


class SessionFeed:
    """A RequestFeed (engine/core/feed.py) for multi-turn sessions. A cancelled turn ends like a
    finished one, its reply cut where it stopped: the session goes on from there."""

    def __init__(
        self,
        plan: SessionPlan,
        make_request: MakeRequest,
        keep_ids: bool,
        scripted_replies: bool,
        vocab: int,
        timer: CancelTimer | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.timer = timer or CancelTimer(None)
        self.plan = plan
        self.max_model_len = max_model_len
        self.make_request = make_request
        self.keep_ids = keep_ids
        self.scripted = scripted_replies
        self.vocab = vocab
        self._events: list[tuple[float, int, Request]] = []  # (arrival, request id, request)
        self.created: list[Request] = []
        self.turn_of: dict[int, tuple[int, int]] = {}  # request id -> (session position, turn)
        self.ended_early = 0  # sessions that stopped at a rejected turn
        for i, session in enumerate(plan.sessions):
            t0 = session.turns[0]
            prompt_len = first_prompt_len(t0.user_len)
            ids = plan.first_prompt_ids(i, vocab) if self._builds(i, 0, prompt_len) else None
            self._push(i, 0, prompt_len, float(plan.starts[i]), ids)

    def _builds(self, i: int, k: int, prompt_len: int) -> bool:
        """Whether turn k's prompt ids are made: not for a turn beyond the model's context,
        which the engine rejects at arrival (as a request's: a `user_len` of 10**12 asked for
        7 TiB of ids midway through the run)."""
        if not self.keep_ids:
            return False
        out = self.plan.sessions[i].turns[k].output_len
        return self.max_model_len is None or prompt_len + out <= self.max_model_len

    def _push(self, i: int, k: int, prompt_len: int, t: float, ids: list[int] | None) -> None:
        rid = self.plan.request_id(i, k)
        req = self.make_request(rid, prompt_len, self.plan.sessions[i].turns[k].output_len, t, ids)
        if self.scripted and ids is not None:
            req.output_token_ids = self.plan.reply_ids(i, k, self.vocab)
        self.turn_of[rid] = (i, k)
        self.created.append(req)
        heapq.heappush(self._events, (t, rid, req))
        self.timer.arm(req)

    # ---- RequestFeed ----------------------------------------------------------------------------
    def next_time(self) -> float | None:
        return _earliest(self._events[0][0] if self._events else None, self.timer.next_time())

    def fire(self, engine, now: float) -> None:
        events = self._events
        while events and events[0][0] <= now:
            _, _, req = heapq.heappop(events)
            if engine.add_request(req) is not None:
                self.ended_early += 1  # can never run: the session cannot go on without it
        for req in self.timer.fire(engine, now):
            self.finished(req)

    def on_step(self, step) -> None:
        for req in step.finished:
            self.finished(req)

    # ---- the next turn ---------------------------------------------------------------------------
    def finished(self, req: Request) -> None:
        """Schedule the session's next turn after ``req`` (finished or aborted) ended."""
        i, k = self.turn_of[req.request_id]
        turns = self.plan.sessions[i].turns
        if k + 1 >= len(turns) or req.status == RequestStatus.REJECTED:
            return
        t = req.finish_time + self.plan.think_time_s(i, k + 1)
        n_out = req.num_output_tokens
        ids = None
        prompt_len = next_prompt_len(req.num_prompt_tokens, n_out, turns[k + 1].user_len)
        if req.prompt_token_ids is not None and self._builds(i, k + 1, prompt_len):
            reply = req.output_token_ids[:n_out]
            ids = self.plan.next_prompt_ids(req.prompt_token_ids, reply, i, k + 1, self.vocab)
        self._push(i, k + 1, prompt_len, t, ids)

    @property
    def not_created(self) -> int:
        return self.plan.num_turns - len(self.created)

    def turn_kind(self, req: Request) -> str:
        i, k = self.turn_of[req.request_id]
        return self.plan.sessions[i].turns[k].kind

    def labels(self, req: Request) -> tuple[int | str, int]:
        """(session_id, turn) of a request, turns counted from 1."""
        i, k = self.turn_of[req.request_id]
        return self.plan.labels[i], k + 1
