"""The streams' own transport (cbbench/targets/stream_pool.py) and what it is for: a streamed
request's events are parsed where the network reads arrive, so the request's coroutine is not
woken once per token event (issue 41: that wake-up, through aiohttp's response objects, was most
of the client's CPU per request at 1,000 req/s). Counted on asyncio's own loop, where every
callback the loop runs is a Python Handle: instructions, not wall-clock time, so a loaded machine
reads the same. The failure paths (cut streams, HTTP errors, bad heads, the keep-alive race, TLS,
DNS) are test_http_target.py's, run through this transport."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the timing server
from timing_server import EARLY_OK_S, fetch_log, timing_server  # noqa: E402

from cbbench.load.workload_types import WorkloadRequest  # noqa: E402
from cbbench.targets.http import EndpointOptions, run_http  # noqa: E402
from cbbench.targets.sse import SseStream  # noqa: E402
from cbbench.targets.transport import HttpFailure  # noqa: E402

TOKENS = 12
REQUESTS = 20
ITL_MS = 4.0  # tokens this far apart arrive in reads of their own
TTFT_MS = 5.0


@pytest.fixture(scope="module")
def server():
    with timing_server(TTFT_MS, ITL_MS) as url:
        yield url


def _count_request_wakeups(monkeypatch) -> list[int]:
    """Counts each wake-up of a request's task (its coroutine resumed by the loop)."""
    calls = [0]
    real = asyncio.events.Handle._run

    def counted(self):
        task = getattr(self._callback, "__self__", None)  # Task.__wakeup / __step: its task
        if isinstance(task, asyncio.Task) and "_exchange" in task.get_coro().__qualname__:
            calls[0] += 1
        return real(self)

    monkeypatch.setattr(asyncio.events.Handle, "_run", counted)
    return calls


def test_a_request_is_not_woken_for_each_token_event(server, monkeypatch):
    # asyncio's loop: every callback it runs is a Python Handle (countable).
    monkeypatch.setenv("CBBENCH_CLIENT_LOOP", "asyncio")
    wakeups = _count_request_wakeups(monkeypatch)
    wreqs = [WorkloadRequest(i, 2, TOKENS, prompt=f"wake-{i}") for i in range(REQUESTS)]
    run = run_http(EndpointOptions(server, served_model="timing-model"), wreqs,
                   np.arange(REQUESTS) * 0.002)
    assert all(r.ok and len(r.token_times_s) == TOKENS for r in run.records)
    assert len(fetch_log(server, clear=True)) == REQUESTS
    per_request = wakeups[0] / REQUESTS
    # Each token event is a network read of its own (ITL apart). Through aiohttp each read
    # woke the request's task (f5e98e5: 18.5 wake-ups a request here); now the read's callback
    # parses the events, and the task wakes for its start, its own send time (made
    # DISPATCH_LEAD_S ahead, it sleeps until then: one or two timer wake-ups), its connection
    # and its end.
    assert 1 <= per_request <= 6 < TOKENS, f"{per_request:.1f} wake-ups of a request's task"


def test_event_times_are_the_reads_times(server):
    wreqs = [WorkloadRequest(i, 2, TOKENS, prompt=f"times-{i}") for i in range(3)]
    run = run_http(EndpointOptions(server, served_model="timing-model"), wreqs, [0.0, 0.0, 0.0])
    log = fetch_log(server, clear=True)
    for r in run.records:
        assert r.ok and len(r.token_times_s) == TOKENS
        assert (np.diff(r.token_times_s) >= 0).all()
        # Timed read by read, not all at the stream's end: the server wrote them ITL apart
        # (two may share a read when the machine is busy; all of them would not).
        assert len(set(r.token_times_s)) > TOKENS // 2
        # The server's tokens are due at absolute times (received + TTFT + i x ITL) and never
        # written more than EARLY_OK_S before; held to the first token instead, a first token
        # written late on a busy machine read the span short (41.97 ms against 42 in one CI run).
        entry = log[f"times-{r.id}"]
        due_last = (TTFT_MS + (TOKENS - 1) * ITL_MS) / 1e3
        assert entry["last_token"] - entry["received"] >= due_last - EARLY_OK_S


def test_events_orjson_refuses_are_read_as_python_reads_them():
    st = SseStream(False, [])
    # NaN: valid for Python's json (a server's float field), refused by orjson.
    st.feed(b'data: {"choices":[{"text":"a","finish_reason":null}],"x":NaN}\n\n', 0.1)
    st.feed(b'data: {"choices":[{"text":"b","finish_reason":"length"}],'
            b'"usage":{"completion_tokens":2,"x":Infinity}}\n\n', 0.2)
    st.feed(b"data: [DONE]\n\n", 0.3)
    st.close(0.3)
    assert st.times == [0.1, 0.2] and st.usage["completion_tokens"] == 2
    with pytest.raises(HttpFailure) as e:
        SseStream(False, []).feed(b"data: {not json\n\n", 0.1)
    assert e.value.error_type == "bad_event" and "malformed event" in str(e.value)
