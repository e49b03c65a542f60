"""--cancel-rate's deadline and a request's last bytes in one event-loop pass: the request
completed (its data and [DONE] were read), so it is not recorded as cancelled."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from cbbench.analysis.records import RequestRecord
from cbbench.targets.http import _Runner
from cbbench.targets.sse import SseStream

DELAY_S = 0.02


async def _deadline_then_last_read() -> RequestRecord:
    loop = asyncio.get_running_loop()
    rec = RequestRecord(id=0, prompt_tokens=1, output_tokens=0, intended_start_s=0.0)
    st = SseStream(False, rec.token_times_s)
    last_read = loop.create_future()

    async def send(ctx, rec, body, st):  # the stream's exchange: sent, then its answer
        st.sent()
        st.feed(b'data: {"choices":[{"text":"a","finish_reason":"length"}]}\n\n', 0.01)
        await last_read  # the read that brings [DONE] and the body's end

    real = loop.call_later

    def call_later(delay, callback, *args):
        if delay != DELAY_S:
            return real(delay, callback, *args)

        def deadline_then_read():  # the deadline's timer, then the read, in one pass
            callback(*args)
            st.feed(b"data: [DONE]\n\n", DELAY_S)
            last_read.set_result(None)
        return real(delay, deadline_then_read)

    loop.call_later = call_later  # type: ignore[method-assign]
    runner = SimpleNamespace(_send=send)
    await _Runner._send_cancelled(runner, None, rec, b"", st, DELAY_S)  # type: ignore[arg-type]
    return rec


def test_a_request_whose_last_read_lands_with_its_cancel_deadline_completed():
    """Before: the cancel's wake-up ran first and cancelled a task whose answer had ended
    (its wake-up queued behind), and the finished request was recorded as cancelled."""
    rec = asyncio.run(_deadline_then_last_read())
    assert not rec.cancelled and rec.error is None and rec.ok
