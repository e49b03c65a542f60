"""The Responses API's stored responses (``store``, on by default as OpenAI's): each finished
response's conversation (its input and its output, as chat messages), so that a next request
naming it in ``previous_response_id`` continues it, and the response itself, which
GET /v1/responses/{id} answers. Kept in memory, the newest first, within a
byte budget (--max-stored-response-bytes) as well as a count (MAX_STORED): an older one is gone
(a request naming it is a 400), as a server restart loses them all.

The budget is in bytes because a count bounds nothing: 4,096 stored responses of a 0.9 MB
input held ~3.6 GB (llama-3-8b's context; ~34 GB at 128k). A conversation's bytes are its
text's (message contents, image URLs, tool-call names and arguments) plus MESSAGE_OVERHEAD
per message, the Python objects around them, and for the response its reasoning's text (its
other strings are the conversation's) and RESPONSE_OVERHEAD; one over the whole budget is not
kept.
"""

from __future__ import annotations

from collections import OrderedDict

from cbbench.server.limits import DEFAULT_MAX_STORED_BYTES
from cbbench.server.protocol import ChatMessage

MAX_STORED = 4096
# A message's pydantic model, its dict and list: measured ~0.5 KB beyond its text.
MESSAGE_OVERHEAD = 512
# A response's dict of dicts (its output items, usage, settings), beyond its texts.
RESPONSE_OVERHEAD = 4096


def conversation_bytes(conversation: list[ChatMessage]) -> int:
    """The bytes a stored conversation holds, from its text (no serialization: on the loop)."""
    total = 0
    for m in conversation:
        total += MESSAGE_OVERHEAD
        content = m.content
        if isinstance(content, str):
            total += len(content)
        elif content:
            for part in content:
                total += len(getattr(part, "text", "") or "")
                url = getattr(getattr(part, "image_url", None), "url", None)
                total += len(url or "")
        for call in m.tool_calls or ():
            fn = getattr(call, "function", None)
            total += len(getattr(fn, "name", "") or "") + len(getattr(fn, "arguments", "") or "")
    return total


class ResponseStore:
    def __init__(self, capacity: int = MAX_STORED,
                 max_bytes: int = DEFAULT_MAX_STORED_BYTES) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[list[ChatMessage], dict | None, int]] = OrderedDict()

    def put(self, response_id: str, conversation: list[ChatMessage], response: dict | None = None,
            reasoning: str = "") -> None:
        """``response``: the body GET /v1/responses/{id} answers; ``reasoning``: its text not
        in the conversation (the bytes it adds)."""
        size = conversation_bytes(conversation)
        if response is not None:
            size += RESPONSE_OVERHEAD + len(reasoning)
        old = self._items.pop(response_id, None)
        if old is not None:
            self.bytes -= old[2]
        if size > self.max_bytes:
            return  # larger than the whole budget: not kept (naming it later is a 400)
        self._items[response_id] = (conversation, response, size)
        self.bytes += size
        while len(self._items) > self.capacity or self.bytes > self.max_bytes:
            _, (_, _, gone) = self._items.popitem(last=False)
            self.bytes -= gone

    def get(self, response_id: str) -> list[ChatMessage] | None:
        item = self._items.get(response_id)
        return item[0] if item is not None else None

    def response(self, response_id: str) -> dict | None:
        item = self._items.get(response_id)
        return item[1] if item is not None else None

    def __len__(self) -> int:
        return len(self._items)
