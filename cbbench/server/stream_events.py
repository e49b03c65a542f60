"""What each output token of a request is (reasoning, answer or a tool call's arguments) and the
stream event that carries a group of them, in vLLM's and OpenAI's field names.

A request that asked for ``reasoning_tokens`` R (a cbbench extension) has its first R output
tokens streamed as reasoning, in ``delta.reasoning_content`` (or ``delta.reasoning``, as newer
vLLM writes it: ``--reasoning-field``). A request that offers ``tools`` (and does not say
``tool_choice: "none"``) has every token after the reasoning streamed as one call of the chosen
tool: the first tool event carries the call's id, type and name, every one its piece of the
``arguments`` (a JSON object ``{"input": "<the tokens' text>"}``, closed by the last token), and
the request ends with ``finish_reason: "tool_calls"``. Otherwise the tokens are ``content``.

One event carries every token one engine step gave the request (several under speculative
decoding, or a --stream-interval), so an event can straddle the reasoning/answer boundary: its
delta then holds both fields, as vLLM's reasoning parsers write it. The request log records
each event's token count and kind (``reasoning``, ``answer``, ``tool``, or e.g.
``reasoning+answer`` at a boundary).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

REASONING = "reasoning"
ANSWER = "answer"
TOOL = "tool"
REASONING_FIELDS = ("reasoning_content", "reasoning")
DEFAULT_REASONING_FIELD = "reasoning_content"
TOOL_ARGS_OPEN = '{"input": "'
TOOL_ARGS_CLOSE = '"}'
TOOL_FINISH_REASON = "tool_calls"


def escaped(text: str) -> str:
    """Text as it sits inside a JSON string (the arguments are JSON text themselves)."""
    return json.dumps(text)[1:-1]


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """One request's output: how many tokens are reasoning, and the tool it calls (None:
    none)."""

    reasoning_tokens: int = 0
    tool_name: str | None = None
    tool_call_id: str | None = None

    @classmethod
    def for_request(cls, reasoning_tokens: int, tool_name: str | None) -> OutputPlan:
        call_id = f"call_{uuid.uuid4().hex[:24]}" if tool_name is not None else None
        return cls(reasoning_tokens, tool_name, call_id)

    @property
    def plain(self) -> bool:
        return self.reasoning_tokens == 0 and self.tool_name is None

    def kind(self, i: int) -> str:
        """The kind of output token i (0-based)."""
        if i < self.reasoning_tokens:
            return REASONING
        return TOOL if self.tool_name is not None else ANSWER

    def split(self, start: int, n: int) -> list[tuple[str, int]]:
        """Tokens start .. start+n-1 as (kind, count) runs, in order."""
        runs: list[tuple[str, int]] = []
        r_end = min(max(self.reasoning_tokens - start, 0), n)
        if r_end:
            runs.append((REASONING, r_end))
        if n - r_end:
            runs.append((self.kind(self.reasoning_tokens), n - r_end))
        return runs


class ChatDeltas:
    """Builds the delta of each event of one chat request, tracking the tool call's state."""

    def __init__(self, plan: OutputPlan, reasoning_field: str = DEFAULT_REASONING_FIELD) -> None:
        self.plan = plan
        self.reasoning_field = reasoning_field
        self._tool_started = False

    def delta(self, pieces: Sequence[Sequence[str]], last: bool) -> dict:
        """``pieces``: (kind, text) runs of one event; ``last``: the request ends with it."""
        d: dict = {}
        for kind, text in pieces:
            if kind == REASONING:
                d[self.reasoning_field] = text
            elif kind == ANSWER:
                d["content"] = text
            else:
                d["tool_calls"] = [self._tool_delta(text, last)]
        return d

    def _tool_delta(self, text: str, last: bool) -> dict:
        """The call's delta: the first opens it (its id, name and the arguments' opening), the
        last closes its arguments."""
        args = escaped(text) + TOOL_ARGS_CLOSE if last else escaped(text)
        if self._tool_started:
            return {"index": 0, "function": {"arguments": args}}
        self._tool_started = True
        return {"index": 0, "id": self.plan.tool_call_id, "type": "function",
                "function": {"name": self.plan.tool_name, "arguments": TOOL_ARGS_OPEN + args}}

    def finish_reason(self, engine_reason: str | None) -> str | None:
        if engine_reason is not None and self._tool_started:
            return TOOL_FINISH_REASON
        return engine_reason

    def message(self, reasoning: str, answer: str, tool_text: str | None) -> dict:
        """The non-streamed answer's message (``tool_text`` None: no token was a tool's)."""
        m: dict = {"role": "assistant", "content": answer if tool_text is None else None,
                   "refusal": None}  # as Shape.full's message
        if reasoning:
            m[self.reasoning_field] = reasoning
        if tool_text is not None:
            self._tool_started = True
            m["tool_calls"] = [{
                "id": self.plan.tool_call_id, "type": "function",
                "function": {"name": self.plan.tool_name,
                             "arguments": TOOL_ARGS_OPEN + escaped(tool_text) + TOOL_ARGS_CLOSE},
            }]
        return m


def event_kind(runs: list[tuple[str, int]]) -> str:
    """The request log's kind of one event: its runs' kinds joined by '+'."""
    return "+".join(k for k, _ in runs)
