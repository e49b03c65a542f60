"""The Responses API's stored responses (``store``, on by default as OpenAI's): each finished
response's conversation (its input and its output, as chat messages), so that a next request
naming it in ``previous_response_id`` continues it. Kept in memory, the newest MAX_STORED; an
older one is gone (a request naming it is a 400), as a server restart loses them all."""

from __future__ import annotations

from collections import OrderedDict

from cbbench.server.protocol import ChatMessage

MAX_STORED = 4096


class ResponseStore:
    def __init__(self, capacity: int = MAX_STORED) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, list[ChatMessage]] = OrderedDict()

    def put(self, response_id: str, conversation: list[ChatMessage]) -> None:
        self._items[response_id] = conversation
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> list[ChatMessage] | None:
        return self._items.get(response_id)
