"""The event-stream parser for one streamed OpenAI response (`/v1/completions` or
`/v1/chat/completions` with `stream: true`).

Bytes go in as the network delivers them (`feed`, with the time that read returned); every
`data:` event with non-empty text is a token event, timestamped with the read that completed
its line; events with empty text are counted (empty_events), not timestamped. The parser keeps what the stream said beyond the token times (`[DONE]`, a
finish_reason, the usage block, the response's id, and the text of each event when asked to) and raises
HttpFailure on a malformed or error event, or a stream that ends before it finished.
"""

from __future__ import annotations

import json

from cbbench.targets.transport import ERROR_BODY_CHARS, HttpFailure

MAX_LINE_BYTES = 1 << 20  # the longest event-stream line buffered before it counts as bad_event
BAD_EVENT_CHARS = 80
MAX_RESPONSE_ID_CHARS = 200  # a server's response id longer than this is cut (it is a label)


def chunk_fields(obj: object, chat: bool) -> tuple[str | None, str | None, dict | None]:
    """(text, finish_reason, usage) of one streamed JSON chunk; HttpFailure on a malformed or
    error event."""
    if type(obj) is not dict:
        raise HttpFailure(
            "bad_event", f"event is not a JSON object: {str(obj)[:BAD_EVENT_CHARS]!r}"
        )
    if "error" in obj or obj.get("object") == "error":  # an error reported mid-stream
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise HttpFailure("bad_event", f"server error event: {str(msg)[:ERROR_BODY_CHARS]}")
    usage = obj.get("usage")
    choices = obj.get("choices")
    if not choices:  # the final usage-only chunk
        return None, None, usage if isinstance(usage, dict) else None
    try:
        choice = choices[0]
        if chat:
            delta = choice.get("delta") or {}
            # Reasoning models stream their thinking as separate fields; those are tokens too.
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            if text is None and delta.get("content") == "" and "role" not in delta:
                text = ""  # not the opening role chunk: a token with no text of its own yet
        else:
            text = choice.get("text")
        finish = choice.get("finish_reason")
    except (AttributeError, TypeError, KeyError, IndexError):
        raise HttpFailure(
            "bad_event", f"unexpected chunk shape: {str(obj)[:BAD_EVENT_CHARS]!r}"
        ) from None
    if text is not None and not isinstance(text, str):
        raise HttpFailure("bad_event", f"non-text token: {str(text)[:BAD_EVENT_CHARS]!r}")
    if finish is not None and not isinstance(finish, str):
        finish = str(finish)
    if text == "" and finish is not None:
        text = None  # the closing chunk carries the finish reason, not a token
    return text, finish, usage if isinstance(usage, dict) else None


class SseStream:
    """One response stream, parsed as it arrives. `times` is the request's token_times_s
    (appended to in place); `pieces`, when kept, the text of each token event."""

    __slots__ = (
        "chat", "times", "pieces", "done", "finish_reason", "usage", "empty_events",
        "response_id", "_tail",
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

    def feed(self, piece: bytes, t: float) -> None:
        """Whatever one network read returned, at run-clock time `t`. (One function per read,
        the lines parsed inline: it runs for every network read of every request.)"""
        if b"\n" not in piece:
            self._tail += piece
            if len(self._tail) > MAX_LINE_BYTES:
                raise HttpFailure(
                    "bad_event", f"event-stream line longer than {MAX_LINE_BYTES} bytes"
                )
            return
        lines = (self._tail + piece).split(b"\n") if self._tail else piece.split(b"\n")
        self._tail = lines.pop()
        times, pieces, chat, loads = self.times, self.pieces, self.chat, json.loads
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, ': comments', 'event:' lines
            data = line[5:].strip()  # and the \r of a CRLF line
            if data == b"[DONE]":
                self.done = True  # read on to the end, so the connection can be reused
                continue
            if self.done:
                continue
            try:
                obj = loads(data)
            except ValueError:
                shown = data[:BAD_EVENT_CHARS].decode("utf-8", "replace")
                raise HttpFailure("bad_event", f"malformed event: {shown!r}") from None
            text, finish, usage = chunk_fields(obj, chat)
            if self.response_id is None:
                rid = obj.get("id")
                if isinstance(rid, str) and rid:
                    self.response_id = rid[:MAX_RESPONSE_ID_CHARS]
            if text:
                times.append(t)
                if pieces is not None:
                    pieces.append(text)
            elif text is not None:
                self.empty_events += 1
            if finish is not None:
                self.finish_reason = finish
            if usage is not None:
                self.usage = usage

    def close(self, t: float) -> None:
        """The body ended (at `t`): parse a last unterminated line, then check that the stream
        finished and carried some text."""
        if self._tail:
            self.feed(b"\n", t)  # ends the last line
        if not (self.done or self.finish_reason is not None):
            raise HttpFailure(
                "stream_cut", f"stream ended before [DONE] after {len(self.times)} token events"
            )
        if not self.times:
            why = f" (finish_reason {self.finish_reason!r})" if self.finish_reason else ""
            raise HttpFailure(
                "bad_event", f"the stream finished without any output text{why}"
            )
