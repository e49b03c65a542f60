"""Load for the in-process engine that depends on the engine: multi-turn sessions (turn k + 1
arrives a think time after turn k's reply finished) and cancellations (a request is aborted
some time after it was sent, unless it finished first).

The engine sees the same growing prompts a chat server would: with token ids (the torch engine,
or prefix caching), turn k + 1's prompt is turn k's prompt ids, then turn k's output ids as
generated (less an EOS that ended them), then the new message in the template (session_plan.py), so a prefix cache finds
everything turn k computed. The simulator samples lengths, not ids, so a session turn's reply
ids are scripted (drawn per turn): the cache then registers the reply's blocks as they are
computed, as a real engine registers what it generated.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from cbbench.engine.core.engine import stops
from cbbench.engine.core.feed import ListFeed
from cbbench.engine.core.request import Request, RequestStatus
from cbbench.load.cancel import CancelPlan
from cbbench.load.session_plan import SessionPlan
from cbbench.load.sessions import first_prompt_len, next_prompt_len

# (request id, prompt_len, output_len, arrival time, prompt ids or None) -> Request
MakeRequest = Callable[[int, int, int, float, "list[int] | None"], Request]


def _successors(nodes) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in nodes]
    for m, node in enumerate(nodes):
        for w in node.waits_on:
            out[w].append(m)
    return out


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
        self.req_of: dict[tuple[int, int], Request] = {}  # (session position, flat turn) -> it
        self.waited_from: dict[int, float] = {}  # request id -> when its wait began
        self._ended: set[int] = set()  # sessions that stopped at a rejected turn
        # Each flat turn's successors in the DAG: the turns that wait on it.
        self.successors = [_successors(s.nodes) for s in plan.sessions]
        for i, session in enumerate(plan.sessions):
            t0 = session.turns[0]
            prompt_len = first_prompt_len(t0.user_len)
            ids = plan.first_prompt_ids(i, vocab) if self._builds(i, 0, prompt_len) else None
            self._push(i, 0, prompt_len, float(plan.starts[i]), ids)

    @property
    def ended_early(self) -> int:
        return len(self._ended)

    def _builds(self, i: int, k: int, prompt_len: int) -> bool:
        """Whether turn k's prompt ids are made: not for a turn beyond the model's context,
        which the engine rejects at arrival (as a request's: a `user_len` of 10**12 asked for
        7 TiB of ids midway through the run)."""
        if not self.keep_ids:
            return False
        out = self.plan.sessions[i].all_turns[k].output_len
        return self.max_model_len is None or prompt_len + out <= self.max_model_len

    def _push(self, i: int, k: int, prompt_len: int, t: float, ids: list[int] | None) -> None:
        rid = self.plan.request_id(i, k)
        req = self.make_request(
            rid, prompt_len, self.plan.sessions[i].all_turns[k].output_len, t, ids)
        if self.scripted and ids is not None:
            req.output_token_ids = self.plan.reply_ids(i, k, self.vocab)
        self.turn_of[rid] = (i, k)
        self.req_of[(i, k)] = req
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
                # Can never run: the turns that wait on it (its agent's, its parent's) cannot go on.
                self._ended.add(self.turn_of[req.request_id][0])
        for req in self.timer.fire(engine, now):
            self.finished(req)

    def on_step(self, step) -> None:
        for req in step.finished:
            self.finished(req)

    # ---- the next turn ---------------------------------------------------------------------------
    def finished(self, req: Request) -> None:
        """Schedule the turns that wait on ``req`` (finished or aborted) and on nothing else
        unfinished: its agent's next turn (once its sub-agents ended too), the sub-agents it
        fans out to, its parent's next turn when it was a sub-agent's last."""
        i, k = self.turn_of[req.request_id]
        if req.status == RequestStatus.REJECTED:
            return
        nodes = self.plan.sessions[i].nodes
        for m in self.successors[i][k]:
            if (i, m) in self.req_of:
                # Already sent: two sub-agents it joins ended in one step, and the first one
                # seen found the other done too (a second push reused the request id, and the
                # heap compared two Requests: a TypeError).
                continue
            waits = [self.req_of.get((i, w)) for w in nodes[m].waits_on]
            if any(r is None or not r.status.is_done or r.status == RequestStatus.REJECTED
                   for r in waits):
                continue  # another turn it waits on is still out (or can never end)
            self._push_next(i, m, max(_finish_time(r) for r in waits if r is not None))

    def _push_next(self, i: int, m: int, waited_from: float) -> None:
        """Flat turn m of session i, its wait starting at ``waited_from``."""
        turn = self.plan.sessions[i].all_turns[m]
        prev = self.plan.sessions[i].nodes[m].prev
        t = waited_from + self.plan.think_time_s(i, m)
        ids = None
        if prev is None:  # a sub-agent's first turn: a history of its own
            prompt_len = first_prompt_len(turn.user_len)
            if self._builds(i, m, prompt_len):
                ids = self.plan.first_prompt_ids(i, self.vocab, m)
        else:
            before = self.req_of[(i, prev)]
            n_out = before.num_output_tokens
            # A reply that ended on its EOS (or a stop token; at max_tokens too, where the
            # finish is "length"): a chat server returns the text before it and its template
            # writes the one end-of-turn tag below (Llama-3's EOS is that tag), so the history
            # holds it once, not twice. Sampled ids only: the simulator's are scripted.
            last = [] if self.scripted or n_out == 0 else before.output_token_ids[n_out - 1:n_out]
            if last and stops(before, last[0]):
                n_out -= 1
            prompt_len = next_prompt_len(before.num_prompt_tokens, n_out, turn.user_len)
            if before.prompt_token_ids is not None and self._builds(i, m, prompt_len):
                reply = before.output_token_ids[:n_out]
                ids = self.plan.next_prompt_ids(before.prompt_token_ids, reply, i, m, self.vocab)
        self._push(i, m, prompt_len, t, ids)
        self.waited_from[self.plan.request_id(i, m)] = waited_from

    @property
    def not_created(self) -> int:
        return self.plan.num_turns - len(self.created)

    def turn_kind(self, req: Request) -> str:
        i, k = self.turn_of[req.request_id]
        return self.plan.sessions[i].all_turns[k].kind

    def agent(self, req: Request) -> str | None:
        i, k = self.turn_of[req.request_id]
        return self.plan.sessions[i].agent_name(k)

    def labels(self, req: Request) -> tuple[int | str, int]:
        """(session_id, turn) of a request, turns counted from 1 within the turn's agent."""
        i, k = self.turn_of[req.request_id]
        return self.plan.labels[i], self.plan.sessions[i].nodes[k].index + 1


def _finish_time(req: Request) -> float:
    assert req.finish_time is not None  # the engine stamps every request it ends (engine.py)
    return req.finish_time
