"""The event-stream parser for one streamed OpenAI response (`/v1/completions` or
`/v1/chat/completions` with `stream: true`).

Bytes go in as the network delivers them (`feed`, with the time that read returned); every
`data:` event with non-empty text is a token event, timestamped with the read that completed
its line; events with empty text are counted (empty_events), not timestamped. An event's text
is reasoning (`delta.reasoning_content` or `delta.reasoning`), answer (`content`, or OpenAI's
`refusal` in its place) or a tool call's (`delta.tool_calls`: name and argument pieces); each
timed event keeps its kind and the running `usage.completion_tokens` when the server sends it
on every chunk (vLLM's `continuous_usage_stats`), from which checks.py counts each event's
tokens exactly. The parser keeps what the stream said beyond the token times (`[DONE]`, a
finish_reason, the usage block, the response's id, the tool calls, and the text of each event
when asked to) and raises HttpFailure on a malformed or error event, or a stream that ends
before it finished.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

try:  # orjson: a compiled JSON parser, several times the standard library's on a token event
    from orjson import loads as fast_loads
except ImportError:  # an install without it parses with the standard library
    fast_loads = json.loads  # type: ignore[assignment]

from cbbench.targets.transport import ERROR_BODY_CHARS, HttpFailure, body_text

MAX_LINE_BYTES = 1 << 20  # the longest event-stream line buffered before it counts as bad_event
BAD_EVENT_CHARS = 80
MAX_RESPONSE_ID_CHARS = 200  # a server's response id longer than this is cut (it is a label)
# The event-stream spec strips one UTF-8 byte-order mark from the start of a stream: a server
# that writes one would otherwise hide its first line's `data:` (and that event's token).
BOM = b"\xef\xbb\xbf"
BOM_BYTES = len(BOM)
EVENT_STREAM = "text/event-stream"
CR = 0x0D  # b"\r" as an int: `CR in piece` is one memchr, several times `b"\r" in piece`


REASONING = "reasoning"
ANSWER = "answer"
TOOL = "tool"
# Reasoning models' reasoning text: vLLM's reasoning parsers (reasoning_content; `reasoning`
# in newer vLLM and OpenAI-compatible servers such as gpt-oss's), before the answer's content.
REASONING_KEYS = ("reasoning_content", "reasoning")


def _strict_loads(data: bytes):
    """The standard library's reading of an event orjson refused: the same objects for what
    both read, and bad_event for what neither does."""
    try:
        return json.loads(data)
    except ValueError:
        shown = data[:BAD_EVENT_CHARS].decode("utf-8", "replace")
        raise HttpFailure("bad_event", f"malformed event: {shown!r}") from None


def _bad_shape(obj) -> HttpFailure:
    return HttpFailure("bad_event", f"unexpected chunk shape: {str(obj)[:BAD_EVENT_CHARS]!r}")


def _text(v, obj) -> str | None:
    if v is not None and not isinstance(v, str):
        raise HttpFailure("bad_event", f"non-text token: {str(v)[:BAD_EVENT_CHARS]!r}")
    return v


def chunk_parts(obj: object, chat: bool, opened: bool = False):
    """(parts, finish_reason, usage, tool_calls) of one streamed JSON chunk: ``parts`` the
    event's (kind, text) runs in stream order (reasoning before answer or tool-call text),
    None for a chunk that carries no token (the opening role chunk, the closing finish, a
    usage-only chunk); an empty list for a token with no text of its own yet. ``opened``: a
    chunk with choices came before (this one is no opening role chunk). ``tool_calls``: the
    delta's tool-call entries (dicts), or None. HttpFailure on a malformed or error event."""
    if type(obj) is not dict:
        raise HttpFailure(
            "bad_event", f"event is not a JSON object: {str(obj)[:BAD_EVENT_CHARS]!r}"
        )
    if "error" in obj or obj.get("object") == "error":  # an error reported mid-stream
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise HttpFailure("bad_event", f"server error event: {str(msg)[:ERROR_BODY_CHARS]}")
    usage = obj.get("usage")
    usage = usage if isinstance(usage, dict) else None
    choices = obj.get("choices")
    if not choices:  # the final usage-only chunk
        return None, None, usage, None
    try:
        choice = choices[0]
        finish = choice.get("finish_reason")
        calls = None
        parts: list[tuple[str, str]] | None
        text: str | None
        if chat:
            delta = choice.get("delta") or {}
            parts = []
            for key in REASONING_KEYS:
                r = _text(delta.get(key), obj)
                if r:
                    parts.append((REASONING, r))
                    break
            content = _text(delta.get("content"), obj)
            if content:
                parts.append((ANSWER, content))
            elif "refusal" in delta and (refusal := _text(delta["refusal"], obj)):
                # OpenAI's refusal streams instead of content: the model's generated answer
                # (its tokens in completion_tokens), timed as text is.
                parts.append((ANSWER, refusal))
            calls = delta.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
                    raise _bad_shape(obj)
                text = "".join(_call_text(c, obj) for c in calls)
                if text:
                    parts.append((TOOL, text))
                calls = calls or None
            if not parts:
                # "": a token with no text of its own yet. The stream's opening role chunk (its
                # first, `role` beside "") is none; later, a role beside "" is a token's (TGI
                # sends one for a special token, SGLang `"role": null` on every delta).
                empty = content == "" and finish is None and (opened or "role" not in delta)
                parts = [] if empty else None
        else:
            text = _text(choice.get("text"), obj)
            parts = [(ANSWER, text)] if text else ([] if text == "" and finish is None
                                                   else None)
    except (AttributeError, TypeError, KeyError, IndexError):
        raise _bad_shape(obj) from None
    if finish is not None and not isinstance(finish, str):
        finish = str(finish)
    return parts, finish, usage, calls


@dataclass(slots=True)
class ToolCall:
    """One tool call the stream made (by its index): the id and the function's name, the first
    of each the server sent; its arguments so far; the timed events that carried its text."""

    id: str | None = None
    name: str | None = None
    arguments: str = ""
    event_idx: list[int] = field(default_factory=list)


def _call_text(call: dict, obj) -> str:
    """The text a tool-call delta streams: the function's name and its arguments' piece (the
    tokens the model generated for the call)."""
    fn = call.get("function") or {}
    if not isinstance(fn, dict):
        raise _bad_shape(obj)
    return (_text(fn.get("name"), obj) or "") + (_text(fn.get("arguments"), obj) or "")


def is_event_stream(ctype: str) -> bool:
    """Whether a Content-Type is the event stream's: media types are case-insensitive (RFC 9110
    section 8.3.1: `Text/Event-Stream` is one), parameters (`; charset=utf-8`) aside."""
    media = ctype.partition(";")[0]
    return media == EVENT_STREAM or media.strip().lower() == EVENT_STREAM


class SseStream:
    """One response stream, parsed as it arrives. `times` is the request's token_times_s
    (appended to in place); `pieces`, when kept, the text of each token event."""

    __slots__ = (
        "chat", "times", "pieces", "done", "finish_reason", "usage", "empty_events",
        "response_id", "_tail", "kinds", "running", "reasoning_pieces", "answer_pieces",
        "tool_calls", "_running_now", "server_metrics", "_at_start", "_event", "_event_t", "_cr",
        "written", "_opened",
    )

    def __init__(self, chat: bool, times: list[float], keep_text: bool = False):
        self.chat = chat
        self.times = times
        self.pieces: list[str] | None = [] if keep_text else None
        self.done = False  # saw data: [DONE]
        self.finish_reason: str | None = None  # the last one seen
        self.usage: dict | None = None
        # Token events with empty text: a token whose text is not complete yet (llama.cpp and
        # vLLM send one per token that ends inside a multi-byte character). Counted as tokens,
        # never timestamped: TTFT and ITL stay the times text arrived.
        self.empty_events = 0
        # OpenAI's response "id" (cmpl-..., chatcmpl-...), from the first chunk that has one:
        # the server's name for the request, which its own logs use too (None: it sent none).
        self.response_id: str | None = None
        self._tail = b""  # an incomplete line, waiting for the rest
        self._at_start = True  # no byte of the stream read yet (its BOM, if any, is next)
        # The data of an event whose blank line has not come yet (its `data:` lines joined with
        # LF), and the time of the read that ended its last `data:` line: its token's time.
        self._event: bytes | None = None
        self._event_t = 0.0
        self._cr = False  # the last read ended in a CR: an LF next is that line end's
        # Set by --cancel-after's timer (an asyncio.Future): resolved once the request is on
        # the wire, where the cancel delay starts (AIPerf's "request fully sent").
        self.written: asyncio.Future[None] | None = None
        # Per timed event: its kind ("reasoning", "answer", "tool", or "reasoning+answer"...
        # for one that straddles a boundary), and the running completion_tokens the server
        # reported with it (stream_options.continuous_usage_stats; None where it sent none).
        self.kinds: list[str] = []
        self.running: list[int | None] = []
        self._running_now: int | None = None  # the latest running count, from any chunk
        # With keep_text: each event's reasoning text and answer text apart (tokenizer counts).
        self.reasoning_pieces: list[str] | None = [] if keep_text else None
        self.answer_pieces: list[str] | None = [] if keep_text else None
        # Tool calls by index.
        self.tool_calls: dict[int, ToolCall] = {}
        # vLLM's --enable-per-request-metrics timings, on the final usage chunk (None: unsent).
        self.server_metrics: dict | None = None
        self._opened = False  # a chunk with choices was read (by the full reading)

    def sent(self) -> None:
        """The request is on the wire: --cancel-after's delay starts now (where one waits)."""
        if self.written is not None and not self.written.done():
            self.written.set_result(None)

    def feed(self, piece: bytes, t: float) -> None:
        """Whatever one network read returned, at run-clock time `t`. (It runs for every network
        read of every request: the lines are split inline, each event's JSON parsed here.)"""
        if self._at_start:
            piece = self._stream_start(piece)
        # The usual read: one whole `data:` event and its blank line, nothing held from
        # before (a server writes each event at once). Parsed without splitting it into lines;
        # a bare CR inside ends a line too (`data: {..}\r\rdata: {..}\n\n` is two events).
        if not self._tail and self._event is None and piece.startswith(b"data:"):
            if piece.endswith(b"\n\n") and piece.count(b"\n") == 2 and CR not in piece:
                self._data(piece[5:-2].strip(), t)
                return
            if piece.endswith(b"\r\n\r\n") and piece.count(b"\n") == 2 \
                    and piece.count(b"\r") == 2:  # the same, CRLF
                self._data(piece[5:-4].strip(), t)
                return
        if b"\n" not in piece and b"\r" not in piece:
            self._hold(piece)
            return
        self._lines(piece, t)

    def _lines(self, piece: bytes, t: float) -> None:
        """A read that ends one line or more, read by the event-stream rules (WHATWG HTML,
        "Server-sent events", as the OpenAI SDK's SSEDecoder reads them): CR, LF or CRLF
        ends a line; an event's `data:` lines are joined with LF, and it is dispatched at the
        blank line after them; other fields and `:` comments are skipped."""
        if self._cr:  # the last read ended in CR: a first LF here is the rest of a CRLF
            self._cr = False
            if not self._tail and piece.startswith(b"\n"):
                piece = piece[1:]
        data = self._tail + piece if self._tail else piece
        if b"\r" in data:
            self._cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._tail = lines.pop()
        event = self._event
        for line in lines:
            if not line:  # the blank line: the event is dispatched
                if event is not None:
                    self._event = None
                    self._data(event, self._event_t)
                    event = None
            elif line.startswith(b"data:"):
                if event is None:
                    event = line[5:].strip()
                else:  # a second data line: JSON may span lines (sse-starlette writes so)
                    event += b"\n" + line[5:].strip()
                    if len(event) > MAX_LINE_BYTES:
                        raise HttpFailure(
                            "bad_event", f"event-stream event longer than {MAX_LINE_BYTES} bytes"
                        )
                self._event_t = t
        self._event = event

    def _stream_start(self, piece: bytes) -> bytes:
        """The stream's first bytes, less one leading BOM. Bytes that may yet be a BOM's first
        (a read cut inside it) wait in the tail for the next read."""
        data = self._tail + piece if self._tail else piece
        if len(data) < BOM_BYTES and BOM.startswith(data):
            self._tail = data
            return b""
        self._at_start = False
        self._tail = b""
        return data[BOM_BYTES:] if data.startswith(BOM) else data

    def _data(self, data: bytes, t: float) -> None:
        """One event's data: [DONE], or a chunk's JSON (ignored after [DONE]: the stream is
        read on to its end, so the connection can be reused)."""
        if data == b"[DONE]":
            self.done = True
        elif not self.done:
            try:
                obj = fast_loads(data)
            except ValueError:
                obj = _strict_loads(data)  # what orjson refuses and Python reads (NaN, big ints)
            self._chunk(obj, t)

    def _hold(self, piece: bytes) -> None:
        """A read that ends no line: keep it for the next (bad_event past MAX_LINE_BYTES)."""
        self._tail += piece
        if len(self._tail) > MAX_LINE_BYTES:
            raise HttpFailure("bad_event", f"event-stream line longer than {MAX_LINE_BYTES} bytes")

    def _chunk(self, obj: object, t: float) -> None:
        """One event's JSON: an OpenAI chunk (another API's stream overrides this)."""
        # The usual event, one token's text and nothing else (no usage, no error, no tool
        # call, no reasoning): timed here, without chunk_parts' general reading. The same
        # outcome as that path (tests/targets/test_sse_fast_path.py); anything else takes it.
        if type(obj) is dict and obj.get("usage") is None and "error" not in obj \
                and obj.get("object") != "error":
            choices = obj.get("choices")
            if type(choices) is list and choices and type(choice := choices[0]) is dict:
                if self.chat:
                    delta = choice.get("delta")
                    text = delta.get("content") if type(delta) is dict and len(delta) == 1 \
                        else None
                else:
                    text = choice.get("text")
                finish = choice.get("finish_reason")
                if type(text) is str and text and (finish is None or type(finish) is str):
                    if self.response_id is None:
                        self._take_id(obj)
                    self._timed([(ANSWER, text)], t)
                    if finish is not None:
                        self.finish_reason = finish
                    return
        self._any_chunk(obj, t)

    def _any_chunk(self, obj: object, t: float) -> None:
        """Any OpenAI chunk, read in full (chunk_parts)."""
        opened = self._opened or bool(self.times)  # (a fast-path token opened it too)
        parts, finish, usage, calls = chunk_parts(obj, self.chat, opened)
        if not self._opened:  # the first chunk with choices is the only opening role chunk
            self._opened = bool(obj.get("choices"))  # type: ignore[attr-defined]  # a dict
        if self.response_id is None:
            self._take_id(obj)  # type: ignore[arg-type]  # chunk_parts checked it is a dict
        if usage is not None:
            self.usage = usage
            m = obj.get("metrics")  # type: ignore[attr-defined]  # a dict (chunk_parts checked); vLLM: with the final usage only
            if type(m) is dict:
                self.server_metrics = m
            ct = usage.get("completion_tokens")
            if type(ct) is int and ct >= 0:
                self._running_now = ct
        if calls is not None:
            self._calls(calls)
        if parts:  # a usage-only chunk carries none of the event's own count
            self._timed(parts, t, self._running_now if usage is not None else None)
        elif parts is not None:
            self.empty_events += 1
        if finish is not None:
            self.finish_reason = finish

    def _take_id(self, obj: dict) -> None:
        rid = obj.get("id")
        if isinstance(rid, str) and rid:
            self.response_id = rid[:MAX_RESPONSE_ID_CHARS]

    def _timed(self, parts: list[tuple[str, str]], t: float, running: int | None = None) -> None:
        """A token event with text: its time, kind and running count (and text, when kept)."""
        self.times.append(t)
        # One kind (most events): no join.
        self.kinds.append(parts[0][0] if len(parts) == 1 else "+".join(k for k, _ in parts))
        self.running.append(running)
        if self.pieces is not None:
            self._keep(parts)

    def _keep(self, parts: list[tuple[str, str]]) -> None:
        """With keep_text: the event's text, and its reasoning and answer text apart."""
        assert self.pieces is not None
        assert self.reasoning_pieces is not None and self.answer_pieces is not None
        self.pieces.append("".join(p for _, p in parts))
        self.reasoning_pieces.append("".join(p for k, p in parts if k == REASONING))
        self.answer_pieces.append("".join(p for k, p in parts if k == ANSWER))

    @staticmethod
    def error_text(body: bytes) -> str:
        """An error response's body as the run's one-line error."""
        return body_text(body)

    def close(self, t: float) -> None:
        """The body ended (at `t`): check that the stream finished and carried some text. An
        event with no blank line after it is cut, and dropped (as the event-stream rules and
        the OpenAI SDK drop it): a body cut inside an event's JSON is a cut stream."""
        if not (self.done or self.finish_reason is not None):
            raise HttpFailure(
                "stream_cut", f"stream ended before [DONE] after {len(self.times)} token events"
            )
        if not self.times:
            why = f" (finish_reason {self.finish_reason!r})" if self.finish_reason else ""
            raise HttpFailure(
                "bad_event", f"the stream finished without any output text{why}"
            )

    def _calls(self, calls: list[dict]) -> None:
        n = len(self.times)  # the event these deltas belong to (appended next, if timed)
        for c in calls:
            idx = c.get("index", 0)
            idx = idx if type(idx) is int else 0
            call = self.tool_calls.get(idx)
            if call is None:
                call = self.tool_calls[idx] = ToolCall()
            if call.id is None and isinstance(cid := c.get("id"), str):
                call.id = cid[:MAX_RESPONSE_ID_CHARS]
            fn = c.get("function") or {}
            if call.name is None and isinstance(name := fn.get("name"), str):
                call.name = name[:MAX_RESPONSE_ID_CHARS]
            args = fn.get("arguments")
            if isinstance(args, str) and len(call.arguments) < MAX_LINE_BYTES:
                call.arguments += args  # a next turn sends the call back
            if not call.event_idx or call.event_idx[-1] != n:
                call.event_idx.append(n)

    def assistant_message(self) -> dict:
        """The reply as a next turn sends it back: the answer's text and the tool calls it
        made (OpenAI's shape)."""
        text = self.answer_text()
        if not self.tool_calls:
            return {"role": "assistant", "content": text}
        calls = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name or "", "arguments": c.arguments}}
            for _, c in sorted(self.tool_calls.items())
        ]
        return {"role": "assistant", "content": text or None, "tool_calls": calls}

    def answer_text(self) -> str:
        """The answer's text (no reasoning, no tool-call text): what a next turn sends back."""
        return "".join(self.answer_pieces or ())
