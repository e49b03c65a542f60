"""`--api responses`: the OpenAI Responses API (POST /v1/responses, ``stream: true``), as vLLM and
OpenAI serve it: the request body, and the parser of its typed event stream.

Token events are the text deltas: ``response.output_text.delta`` and ``response.refusal.delta``
(answer), ``response.reasoning_text.delta`` (vLLM's reasoning text;
``response.reasoning_summary_text.delta`` too, OpenAI's reasoning summaries) and ``response.function_call_arguments.delta`` (a tool call's
arguments; the call's id and name come with its ``response.output_item.added``). The stream ends
with ``response.completed`` or ``response.incomplete`` (vLLM sends completed, with status
incomplete), whose ``usage`` is taken as the chat usage it matches (``input_tokens`` ->
prompt_tokens, ``output_tokens`` -> completion_tokens, ``input_tokens_details.cached_tokens``,
``output_tokens_details.reasoning_tokens``), and the finish reason in chat's words: ``length``
for max_output_tokens (a call cut by it too), ``content_filter`` for an incomplete response its
filter stopped, ``tool_calls`` after a call, else ``stop``. ``error`` and
``response.failed`` events fail the request. The server sends no running usage, so each event's
tokens come from --tokenizer, else one per event (checks.py warns when usage shows more).

Multi-turn sessions send the whole conversation as ``input`` (messages, the model's
``function_call`` items and their ``function_call_output``), never ``previous_response_id``:
every server that speaks the API takes the full input, whether or not it stores responses.
"""

from __future__ import annotations

import json

from cbbench.targets.sse import ANSWER, REASONING, TOOL, SseStream, _bad_shape
from cbbench.targets.transport import ERROR_BODY_CHARS, HttpFailure

PATH = "/v1/responses"
TEXT_DELTAS = {
    "response.output_text.delta": ANSWER,
    "response.reasoning_text.delta": REASONING,
    "response.reasoning_summary_text.delta": REASONING,
    # A refusal is the model's answer, generated as text is (in output_tokens): TTFT at its
    # first delta. (response.refusal.done repeats the text: no token.)
    "response.refusal.delta": ANSWER,
}
FINAL = ("response.completed", "response.incomplete")
FAILED = ("error", "response.failed")
# incomplete_details.reason in chat's words; any other (max_output_tokens, or none: vLLM's
# status incomplete) is the output limit.
INCOMPLETE_REASONS = {"content_filter": "content_filter"}


class ResponsesStream(SseStream):
    __slots__ = ()

    def __init__(self, times: list[float], keep_text: bool = False) -> None:
        super().__init__(True, times, keep_text)

    def _chunk(self, obj: object, t: float) -> None:
        if type(obj) is not dict:
            raise _bad_shape(obj)
        kind = obj.get("type")
        if kind in TEXT_DELTAS:
            text = obj.get("delta")
            if not isinstance(text, str):
                raise _bad_shape(obj)
            if text:
                self._timed([(TEXT_DELTAS[kind], text)], t)
            else:
                self.empty_events += 1
        elif kind == "response.function_call_arguments.delta":
            self._arguments(obj, t)
        elif kind == "response.output_item.added":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                self._calls([{"index": obj.get("output_index", 0), "id": item.get("call_id"),
                              "function": {"name": item.get("name")}}])
        elif kind in FINAL:
            self._final(obj.get("response"))
        elif kind in FAILED:
            raise HttpFailure("bad_event", f"server error event: {_error_message(obj)}")
        elif kind == "response.created" and self.response_id is None:
            self._take_id(obj.get("response") or {})

    def _arguments(self, obj: dict, t: float) -> None:
        text = obj.get("delta")
        if not isinstance(text, str):
            raise _bad_shape(obj)
        self._calls([{"index": obj.get("output_index", 0), "function": {"arguments": text}}])
        if text:
            self._timed([(TOOL, text)], t)
        else:
            self.empty_events += 1

    def _final(self, response: object) -> None:
        if not isinstance(response, dict):
            raise _bad_shape(response)
        self.done = True
        u = response.get("usage")
        if isinstance(u, dict):
            usage: dict = {"prompt_tokens": u.get("input_tokens"),
                           "completion_tokens": u.get("output_tokens")}
            cached = (u.get("input_tokens_details") or {}).get("cached_tokens")
            if cached is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            reasoning = (u.get("output_tokens_details") or {}).get("reasoning_tokens")
            if reasoning is not None:
                usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
            self.usage = usage
        reason = (response.get("incomplete_details") or {}).get("reason")
        # An incomplete response says why first: a call cut by max_output_tokens is a length
        # finish, as chat's finish_reason says of it, and a filtered one is no length finish.
        if response.get("status") == "incomplete" or reason is not None:
            self.finish_reason = INCOMPLETE_REASONS.get(str(reason), "length")
        elif self.tool_calls:
            self.finish_reason = "tool_calls"
        else:
            self.finish_reason = "stop"


def _error_message(obj: dict) -> str:
    err = obj.get("error")
    if obj.get("type") == "response.failed":
        err = (obj.get("response") or {}).get("error")
    src = err if isinstance(err, dict) else obj
    return str(src.get("message", src))[:ERROR_BODY_CHARS]


# ---- the request ---------------------------------------------------------------------------
def payload(model: str) -> dict:
    """The fields every request of a run carries."""
    return {"model": model, "stream": True, "temperature": 0, "store": False}


def _tools(extra: dict | None) -> dict:
    """request_fields' chat-shaped tools and tool_choice, in the Responses API's shape."""
    if not extra:
        return {}
    out = dict(extra)
    if "tools" in out:
        out["tools"] = [{"type": "function", "name": t["function"]["name"],
                         "parameters": t["function"].get("parameters") or {}}
                        for t in out["tools"]]
    choice = out.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "function", "name": choice["function"]["name"]}
    return out


def input_items(messages: list[dict]) -> list[dict]:
    """Chat-shaped messages (a session's history) as Responses input items."""
    items: list[dict] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"),
                          "output": m.get("content") or ""})
            continue
        if m.get("content"):
            items.append({"role": role, "content": m["content"]})
        for c in m.get("tool_calls") or ():
            items.append({"type": "function_call", "call_id": c["id"],
                          "name": c["function"]["name"], "arguments": c["function"]["arguments"]})
    return items


def _body(ctx, extra: dict | None, **fields) -> bytes:
    """The run's fields, the request's tools in this API's shape, then the request's own."""
    return json.dumps({**ctx.payload, **_tools(extra), **fields}, separators=(",", ":")).encode()


def single_body(ctx, prompt: str, max_tokens: int, extra: dict | None = None) -> bytes:
    return _body(ctx, extra, input=prompt, max_output_tokens=max_tokens)


def messages_body(ctx, messages: list[dict], max_tokens: int, extra: dict | None = None) -> bytes:
    return _body(ctx, extra, input=input_items(messages), max_output_tokens=max_tokens)
