"""Multi-turn sessions against an endpoint, over the chat API (or the Responses or Anthropic API:
the same history, in their shapes; api_specs.py).

Each session is one coroutine, as a user at a chat window: it starts at its intended time (the
arrival process), sends turn 1 as ``messages``, and once the reply has finished waits its
think time and sends turn 2 with the whole history -- every earlier user message and the
assistant's replies *as the server sent them* -- and so on. The server applies its own chat
template to the messages, so its prefix cache sees exactly the sharing a real client causes.

A session with sub-agents (load/session_dag.py) runs each agent as a coroutine: after a turn
that fans out, its sub-agents run as coroutines of their own and the next turn awaits them all.
A failed turn ends its agent and every agent waiting on it (the history it would carry is
missing); those turns are not sent; a cancelled turn (--cancel-rate) is history as far as it
got, and the session goes on. The sessions are a dispatch strategy handed to the one HTTP runner (http.py): its
slots, sends, records and clock serve every turn, as they serve a single request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.load.output_kinds import request_fields
from cbbench.load.prompts import ASSUMED_SPECIAL_TOKENS, IdText, _ExactFitter, synthetic_prompt
from cbbench.load.session_plan import SessionPlan
from cbbench.load.sessions import TOOL_TURN, first_prompt_len, next_prompt_len
from cbbench.targets.apis.api_specs import SPECS
from cbbench.targets.client_health import sleep_until
from cbbench.targets.options import EndpointOptions
from cbbench.targets.request import RequestContext
from cbbench.targets.sse import SseStream


class TurnRunner(Protocol):
    """What a session needs of the run that sends its turns (http.py's runner): its clock, its
    tasks, its stop flag, its request context and its one-request exchange. Named here, not
    imported from http.py, which imports this module (no import cycle, not even for types)."""

    t0: float
    stopped: bool
    pending: set[asyncio.Task]
    ctx: RequestContext

    def _exchange(self, pos: int, rec: RequestRecord, st: SseStream,
                  make_body: Callable[[], bytes]) -> Awaitable[None]: ...

    def wait_until(self, deadline: float) -> Awaitable[None]: ...


def messages_body(ctx: RequestContext, messages: list[dict], max_tokens: int,
                  extra: dict | None = None) -> bytes:
    payload = dict(ctx.payload)
    payload["messages"] = messages
    payload["max_tokens"] = max_tokens
    if extra:
        payload.update(extra)
    return json.dumps(payload, separators=(",", ":")).encode()


class SessionDispatch:
    """What the HTTP runner sends when the load is multi-turn sessions: the dispatcher starts
    sessions at their arrival times, and each session sends its own turns through the runner
    (a turn waits for a slot, is sent and recorded like a single request). Records are kept by
    the turn's request id (plan.request_id), one slot per turn of the plan."""

    def __init__(self, opts: EndpointOptions, plan: SessionPlan, tokenizer) -> None:
        self.spec = SPECS[opts.api]
        if not self.spec.sessions:
            raise UsageError("multi-turn sessions send the history as messages: use --api chat, "
                             "responses or anthropic")
        self.opts = opts
        self.plan = plan
        self.tokenizer = tokenizer
        self._ended: set[int] = set()  # sessions cut short by a failed turn
        self.fitter = _ExactFitter.for_tokenizer(tokenizer) if tokenizer is not None else None
        self._id_text: IdText | None = None  # made for the first turn that carries ids
        self.kinds: dict[str, int] = {}
        self.user_texts = {i: [self._user_text(i, k) for k in range(plan.sessions[i].num_turns)]
                           for i in plan.active_sessions}

    @property
    def ended_early(self) -> int:
        return len(self._ended)

    def _user_text(self, i: int, k: int) -> str:
        turn = self.plan.sessions[i].all_turns[k]
        if turn.user_text is not None:
            kind, text = "text", turn.user_text
        elif turn.user_token_ids is not None:
            if self.tokenizer is None:
                raise UsageError(
                    f"session {self.plan.labels[i]} turn {k + 1} carries token ids: give "
                    "--tokenizer (a tokenizer.json) to send them as chat text"
                )
            if self._id_text is None:
                self._id_text = IdText.for_tokenizer(self.tokenizer)
            # Text of user_len tokens, as a synthetic turn's (load/prompts.py IdText).
            kind, text = "decoded", self._id_text.text(turn.user_token_ids)
        else:
            # synthetic_prompt leaves room for the BOS a plain prompt gets; a chat message's
            # length is its content alone, so ask for that many more.
            special = self.fitter.special if self.fitter else ASSUMED_SPECIAL_TOKENS
            kind = "synthetic_exact" if self.fitter else "synthetic_approx"
            text = synthetic_prompt(turn.user_len + special, self.plan.request_id(i, k),
                                    self.opts.seed, self.fitter)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        return text

    async def dispatch(self, runner: TurnRunner) -> None:
        loop = asyncio.get_running_loop()
        starts = [float(t) for t in self.plan.starts]
        for i in sorted(self.plan.active_sessions, key=starts.__getitem__):
            await sleep_until(runner.t0 + starts[i])
            task = loop.create_task(self._session(runner, i))
            runner.pending.add(task)
            task.add_done_callback(runner.pending.discard)

    async def _session(self, runner: TurnRunner, i: int) -> None:
        await self._agent(runner, i, 0, float(self.plan.starts[i]), None)

    async def _agent(self, runner: TurnRunner, i: int, k: int, intended: float,
                     waited_from: float | None) -> float | None:
        """One agent's conversation from its first turn, flat turn k (the main agent's, or a
        sub-agent's, started by the turn that fanned out to it). After a turn that fans out,
        its sub-agents run in parallel, and the next turn waits for them all, then its own
        wait. Returns when its last turn's last token came (None: a turn failed, or none
        came). A turn's wait is recorded from the last token of what it waited on: a tool's
        time then holds the client's read of the stream's end, as a user's wait would."""
        plan = self.plan
        session = plan.sessions[i]
        turns, nodes = session.all_turns, session.nodes
        messages: list[dict] = []
        prompt_len = first_prompt_len(turns[k].user_len)
        while True:
            if waited_from is not None:  # its think time; the run's stop ends it at once,
                await runner.wait_until(runner.t0 + intended)  # and the turn is not sent
            turn = turns[k]
            if turn.kind == TOOL_TURN:  # the tool's result, for the call the last reply made
                call_id = messages[-1].get("tool_calls", [{}])[0].get("id")
                messages.append({"role": "tool", "tool_call_id": call_id,
                                 "content": self.user_texts[i][k]})
            else:
                messages.append({"role": "user", "content": self.user_texts[i][k]})
            rec, st = await self._turn(runner, i, k, messages, intended, prompt_len, waited_from)
            last = k + 1 >= len(turns) or nodes[k + 1].prev != k
            if runner.stopped or rec.error is not None or rec.send_s is None:
                if not runner.stopped and (not last or nodes[k].agent):
                    self._ended.add(i)  # its later turns, or its parent's, are not sent
                return None
            # The answer as the server sent it; a reasoning model's reasoning is not sent back
            # (OpenAI's and vLLM's convention), a tool call's text is not content.
            messages.append(st.assistant_message())
            end = rec.token_times_s[-1] if rec.token_times_s else rec.send_s
            children = nodes[k].children
            if children:
                now = time.perf_counter() - runner.t0
                ends = await asyncio.gather(*(
                    self._agent(runner, i, c, now + plan.think_time_s(i, c), end)
                    for c in children))
                came = [e for e in ends if e is not None]
                if len(came) < len(ends):  # a sub-agent failed
                    return None
                end = max(end, *came)
            if last:
                return end
            # The reply's length as counted for its record (the server's usage if sent).
            prompt_len = next_prompt_len(prompt_len, rec.output_tokens, turns[k + 1].user_len)
            k += 1
            waited_from = end
            intended = time.perf_counter() - runner.t0 + plan.think_time_s(i, k)

    async def _turn(self, runner: TurnRunner, i: int, k: int, messages: list[dict], intended: float,
                    prompt_len: int, waited_from: float | None,
                    ) -> tuple[RequestRecord, SseStream]:
        """One turn, as the runner sends one request: wait for a slot, send, record."""
        pos = self.plan.request_id(i, k)
        session = self.plan.sessions[i]
        turn = session.all_turns[k]
        rec = RequestRecord(id=pos, prompt_tokens=prompt_len, output_tokens=0,
                            intended_start_s=intended, session_id=self.plan.labels[i],
                            turn=session.nodes[k].index + 1, max_tokens=turn.output_len,
                            turn_kind=turn.kind, agent=session.agent_name(k),
                            waited_from_s=waited_from)
        st = self.spec.stream(rec.token_times_s, True)
        # A session with tools offers them on every turn; a turn that asks for no call says
        # "none" (a model offered tools may call one).
        extra = request_fields(0, session.tools, turn.tool_choice or "none", True)
        make = self.spec.messages_body or messages_body
        await runner._exchange(
            pos, rec, st, lambda: make(runner.ctx, messages, turn.output_len, extra))
        return rec, st
