"""`--api anthropic`: Anthropic's Messages API (POST /v1/messages, ``stream: true``): the request
body, its headers, and the parser of its event stream.

``message_start`` carries the message id (the record's server_request_id) and
``usage.input_tokens``; the prompt tokens are input_tokens plus ``cache_read_input_tokens`` and
``cache_creation_input_tokens`` (Anthropic counts cached prompt tokens apart), and the cache
reads are the record's cached tokens. ``message_delta``'s usage is cumulative: a count it
states replaces message_start's (as Anthropic's SDK reads it). Token events are the ``content_block_delta`` events with
text: ``text_delta`` (answer), ``thinking_delta`` (reasoning), ``input_json_delta`` (a
``tool_use`` block's input: the call's id and name come with its ``content_block_start``; a
``server_tool_use`` block's too, but that call the server runs, so it is none of the record's);
``signature_delta`` is no token. ``message_delta`` has the cumulative ``usage.output_tokens``
and the stop reason, in chat's words (``max_tokens`` and ``model_context_window_exceeded``
-> length, ``tool_use`` -> tool_calls, ``refusal`` -> content_filter, else stop); ``message_stop`` ends the stream. An ``error`` event, or an error response
(``{"type": "error", "error": {"type", "message"}}``), is one line: ``TYPE: message``.

Anthropic's usage has no reasoning count: thinking tokens are counted from the thinking events
(one per event unless --tokenizer counts them). Requests carry ``anthropic-version``
(DEFAULT_VERSION unless a --header gives one); the key goes in ``--header x-api-key=env:NAME``.
"""

from __future__ import annotations

import json

from cbbench.targets.sse import ANSWER, REASONING, TOOL, SseStream, _bad_shape
from cbbench.targets.transport import ERROR_BODY_CHARS, HttpFailure, body_text

PATH = "/v1/messages"
VERSION_HEADER = "anthropic-version"
DEFAULT_VERSION = "2023-06-01"
DELTA_KINDS = {  # content_block_delta's delta type -> (its text field, the token kind)
    "text_delta": ("text", ANSWER),
    "thinking_delta": ("thinking", REASONING),
    "input_json_delta": ("partial_json", TOOL),
}
# Anthropic's stop_reason in chat's finish_reason words (as Vercel's AI SDK maps them): a reply
# cut by the context window is cut for length, one its safety classifiers stopped is filtered.
STOP_REASONS = {"max_tokens": "length", "model_context_window_exceeded": "length",
                "tool_use": "tool_calls", "refusal": "content_filter"}


PROMPT_COUNTS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


class AnthropicStream(SseStream):
    __slots__ = ("_prompt_counts", "_server_tools")

    def __init__(self, times: list[float], keep_text: bool = False) -> None:
        super().__init__(True, times, keep_text)
        # input_tokens, cache reads, cache writes: message_start's, each overwritten by a
        # message_delta that states it (its counts are cumulative, as the SDK reads them).
        self._prompt_counts: list[int | None] = [None, None, None]
        # The indices of server_tool_use blocks (web_search...): their input is generated
        # tokens, but the server runs the tool (its result a block of its own, no deltas), so
        # it is no call of the client's to record or answer in a next turn.
        self._server_tools: set[int] = set()

    def _chunk(self, obj: object, t: float) -> None:
        if type(obj) is not dict:
            raise _bad_shape(obj)
        kind = obj.get("type")
        if kind == "content_block_delta":
            self._delta(obj, t)
        elif kind == "content_block_start":
            block = obj.get("content_block")
            block = block if isinstance(block, dict) else {}
            btype = block.get("type")
            if btype == "tool_use":
                self._calls([{"index": obj.get("index", 0), "id": block.get("id"),
                              "function": {"name": block.get("name")}}])
            elif btype == "server_tool_use":
                self._server_tools.add(obj.get("index", 0))
        elif kind == "message_start":
            self._start(obj.get("message"))
        elif kind == "message_delta":
            self._message_delta(obj)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise HttpFailure("bad_event", f"server error event: {error_line(obj)}")

    def _delta(self, obj: dict, t: float) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            raise _bad_shape(obj)
        delta_type = delta.get("type")
        if not isinstance(delta_type, str):  # (a list or an object here was a TypeError)
            raise _bad_shape(obj)
        known = DELTA_KINDS.get(delta_type)
        if known is None:  # signature_delta, citations: no token
            return
        field, kind = known
        text = delta.get(field)
        if not isinstance(text, str):
            raise _bad_shape(obj)
        if kind == TOOL and obj.get("index", 0) not in self._server_tools:
            self._calls([{"index": obj.get("index", 0), "function": {"arguments": text}}])
        if text:
            self._timed([(kind, text)], t)
        else:
            self.empty_events += 1

    def _start(self, message: object) -> None:
        if not isinstance(message, dict):
            raise _bad_shape(message)
        self._take_id(message)
        self._take_prompt_counts(message.get("usage"))

    def _take_prompt_counts(self, u: object) -> None:
        """The prompt counts a usage block states (all ints or nulls, else none of them)."""
        if not isinstance(u, dict):
            return
        counts = [u.get(k) for k in PROMPT_COUNTS]
        if all(type(c) is int or c is None for c in counts):
            self._prompt_counts = [c if c is not None else old
                                   for c, old in zip(counts, self._prompt_counts)]

    def _message_delta(self, obj: dict) -> None:
        u = obj.get("usage")
        if isinstance(u, dict):
            self._take_prompt_counts(u)
            inp, read, write = self._prompt_counts
            prompt = None if inp is None else inp + (read or 0) + (write or 0)
            usage: dict = {"prompt_tokens": prompt, "completion_tokens": u.get("output_tokens")}
            if read is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": read}
            self.usage = usage
        reason = (obj.get("delta") or {}).get("stop_reason")
        if isinstance(reason, str):
            self.finish_reason = STOP_REASONS.get(reason, "stop")

    @staticmethod
    def error_text(body: bytes) -> str:
        try:
            return error_line(json.loads(body))
        except (ValueError, AttributeError, TypeError):
            return body_text(body)


def error_line(obj: dict) -> str:
    """Anthropic's ``{"type": "error", "error": {"type", "message"}}`` as ``TYPE: message``."""
    err = obj.get("error")
    if not isinstance(err, dict):
        raise TypeError("not Anthropic's error shape")
    return f"{err.get('type', 'error')}: {err.get('message', '')}"[:ERROR_BODY_CHARS]


# ---- the request ---------------------------------------------------------------------------
def payload(model: str) -> dict:
    return {"model": model, "stream": True, "temperature": 0}


def headers(user: dict[str, str]) -> dict[str, str]:
    """anthropic-version unless the user's --header gives one."""
    if any(k.lower() == VERSION_HEADER for k in user):
        return {}
    return {VERSION_HEADER: DEFAULT_VERSION}


def _tools(extra: dict | None) -> dict:
    if not extra:
        return {}
    out = dict(extra)
    if "tools" in out:
        out["tools"] = [{"name": t["function"]["name"],
                         "input_schema": t["function"].get("parameters") or {"type": "object"}}
                        for t in out["tools"]]
    choice = out.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "tool", "name": choice["function"]["name"]}
    elif choice is not None:
        out["tool_choice"] = {"type": {"required": "any"}.get(choice, choice)}
    return out


def _blocks(m: dict) -> list[dict]:
    blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
    for c in m.get("tool_calls") or ():
        try:
            args = json.loads(c["function"]["arguments"] or "{}")
        except ValueError:
            args = {"input": c["function"]["arguments"]}
        blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                       "input": args if isinstance(args, dict) else {"input": args}})
    return blocks


def to_messages(messages: list[dict]) -> tuple[str | None, list[dict]]:
    """Chat-shaped messages (a session's history) as Anthropic's system and messages: a tool
    result is a user turn's tool_result block."""
    system = [m["content"] for m in messages if m["role"] == "system" and m.get("content")]
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": [{
                "type": "tool_result", "tool_use_id": m.get("tool_call_id"),
                "content": m.get("content") or ""}]})
        elif m["role"] == "assistant":
            out.append({"role": "assistant", "content": _blocks(m)})
        elif m["role"] != "system":
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return ("\n".join(system) or None), out


def _body(ctx, extra: dict | None, **fields) -> bytes:
    """The run's fields, the request's tools in this API's shape, then the request's own."""
    return json.dumps({**ctx.payload, **_tools(extra), **fields}, separators=(",", ":")).encode()


def single_body(ctx, prompt: str, max_tokens: int, extra: dict | None = None) -> bytes:
    return _body(ctx, extra, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)


def messages_body(ctx, messages: list[dict], max_tokens: int, extra: dict | None = None) -> bytes:
    system, turns = to_messages(messages)
    return _body(ctx, extra, messages=turns, **({"system": system} if system else {}),
                 max_tokens=max_tokens)
