"""The stream the Responses API (responses_api.py) and Anthropic's Messages (anthropic_api.py)
both write: an answer's (kind, text) pieces as blocks (output items; content blocks), each
opened when its kind starts, filled by deltas, closed when the next kind starts or the answer
ends; a tool call's text is its JSON arguments (stream_events.py). Each API says what it writes
at a block's start, delta and stop; when blocks open and close is decided here, once.
"""

from __future__ import annotations

import json

from cbbench.server.stream_events import (
    ANSWER,
    REASONING,
    TOOL,
    TOOL_ARGS_CLOSE,
    TOOL_ARGS_OPEN,
    TOOL_FINISH_REASON,
    escaped,
)


def typed_event(obj: dict) -> bytes:
    """One SSE event named by its JSON's ``type``."""
    return (f"event: {obj['type']}\ndata: ".encode()
            + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class BlockStream:
    """One request's blocks: which kind is open (None: none), its index, and whether the tool
    call started (its arguments' opening written)."""

    def __init__(self) -> None:
        self.open: str | None = None  # the kind whose block is open
        self.index = -1  # the open (or last) block's index
        self.tool_started = False

    def tokens(self, pieces: list[list[str]], n: int, last: bool,
               engine_finish: str | None) -> bytes:
        out = b""
        for kind, text in pieces:
            if kind not in (REASONING, ANSWER):
                kind = TOOL
                text = escaped(text)
                if not self.tool_started:
                    self.tool_started = True
                    text = TOOL_ARGS_OPEN + text
                if last:
                    text += TOOL_ARGS_CLOSE
            if self.open != kind:
                out += self._open(kind)
            out += self._delta(kind, text)
        if last:
            out += self._close()
        return out

    def finish_reason(self, engine_finish: str | None) -> str | None:
        """The request log's finish reason: a tool call's answer ends in chat's tool_calls."""
        if engine_finish is not None and self.tool_started:
            return TOOL_FINISH_REASON
        return engine_finish

    def _open(self, kind: str) -> bytes:
        out = self._close()
        self.open, self.index = kind, self.index + 1
        return out + self._started(kind)

    def _close(self) -> bytes:
        kind = self.open
        if kind is None:
            return b""
        self.open = None
        return self._stopped(kind)

    # ---- each API's events (block self.index of kind: opened, its text, closed) -----------
    def _started(self, kind: str) -> bytes:
        raise NotImplementedError

    def _delta(self, kind: str, text: str) -> bytes:
        raise NotImplementedError

    def _stopped(self, kind: str) -> bytes:
        raise NotImplementedError
