"""The response bodies of one generation request, in OpenAI's shapes.

A streamed token's event differs from the previous one only in its text, so each request
builds the bytes around the text once and fills the text in per token: one JSON string escape
per token instead of serializing a dict of nested dicts and lists (the bytes are the same as
``json.dumps(chunk, separators=(",", ":"))`` would write). The rare events (the finish, usage,
errors) are serialized in full.
"""

from __future__ import annotations

import json
import time
import uuid
from json.encoder import encode_basestring_ascii as json_string

from cbbench.server.protocol import usage

SSE_PREFIX = b"data: "
SSE_END = b"\n\n"
SSE_DONE = b"data: [DONE]\n\n"
MAX_REQUEST_ID_CHARS = 128


def sse_bytes(obj: dict) -> bytes:
    return SSE_PREFIX + json.dumps(obj, separators=(",", ":")).encode() + SSE_END


def request_id(prefix: str, header: str | None, sep: str = "-") -> str:
    """vLLM's ids: the prefix and the client's X-Request-Id when it sent a usable one, else a
    random hex id (``sep``: "_" for the Responses and Anthropic ids, resp_... and msg_...)."""
    if header and len(header) <= MAX_REQUEST_ID_CHARS and header.isprintable():
        return f"{prefix}{sep}{header}"
    return f"{prefix}{sep}{uuid.uuid4().hex}"


class Shape:
    """Builds one request's response objects for its endpoint (completions or chat)."""

    def __init__(self, chat: bool, model: str, client_request_id: str | None = None) -> None:
        self.chat = chat
        self.id = request_id("chatcmpl" if chat else "cmpl", client_request_id)
        self.created = int(time.time())
        self.model = model
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"
        head = json.dumps(self._head(self.chunk_object), separators=(",", ":"))[:-1]
        text_key = '"delta":{"content":' if chat else '"text":'
        self._token_head = (f'data: {head},"choices":[{{"index":0,{text_key}').encode()
        close = "}" if chat else ""
        self._token_tail = f'{close},"logprobs":null,"finish_reason":null}}]}}\n\n'.encode()
        # The same event with the running usage (stream_options.continuous_usage_stats).
        self._usage_tail = (
            f'{close},"logprobs":null,"finish_reason":null}}],"usage":{{"prompt_tokens":'
        ).encode()

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def token_event(self, text: str) -> bytes:
        """The SSE event of a token that does not finish the request."""
        return self._token_head + json_string(text).encode() + self._token_tail

    def token_event_usage(self, text: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """token_event with the running usage after the choices, as json.dumps writes it."""
        return b"".join((
            self._token_head, json_string(text).encode(), self._usage_tail,
            b'%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
            % (prompt_tokens, completion_tokens, prompt_tokens + completion_tokens),
        ))

    def _body(self, obj: str, choices: list[dict], usage: dict | None = None) -> dict:
        """A response object or chunk: the head (as _head), its choices and, when given, its
        usage. Built as one literal: this is once per streamed event past the byte template."""
        d = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
             "choices": choices}
        if usage is not None:
            d["usage"] = usage
        return d

    def chunk(self, text: str, finish_reason: str | None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._body(self.chunk_object, [choice])

    def delta_chunk(self, delta: dict, finish_reason: str | None) -> dict:
        """A chat chunk with any delta (reasoning, content, tool calls, or several)."""
        return self._body(self.chunk_object, [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        ])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int, **details) -> dict:
        return self._body(self.chunk_object, [], usage(prompt_tokens, completion_tokens,
                                                       **details))

    def full(self, text: str, finish_reason: str | None, prompt_tokens: int, n: int,
             message: dict | None = None, **details) -> dict:
        if self.chat:
            obj = "chat.completion"
            # refusal: required (nullable) by OpenAI's spec; vLLM's ChatMessage sends null.
            message = message or {"role": "assistant", "content": text, "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        else:
            obj = "text_completion"
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._body(obj, [choice], usage(prompt_tokens, n, **details))
