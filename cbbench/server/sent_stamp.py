"""When the request log says a response's bytes were sent (``*_sent``, ``events``' times).

The stamp is taken as the bytes are handed to the ASGI server's ``send``, before it is awaited:
uvicorn writes them to the transport inside that call, so a client can read them right after,
while the coroutine resumes only when the event loop (and the GIL, which the engine thread may
hold for a 5 ms switch interval) gets back to it. Stamped after the await, an event read as
written up to ~6 ms after the client had it; stamped before, no logged time is later than the
client's receipt (a slow reader's bytes may wait in the buffer after it: the log's time is
then the hand-over, the earliest the client could have them).
"""

from __future__ import annotations

import time

from cbbench.server.protocol import send_json


async def send_json_stamped(send, status: int, obj: dict) -> float:
    """``send_json``; returns the perf_counter time its body was handed to ``send``."""
    stamped = 0.0

    async def stamping(message: dict) -> None:
        nonlocal stamped
        if message["type"] == "http.response.body":
            stamped = time.perf_counter()
        await send(message)

    await send_json(stamping, status, obj)
    return stamped
