"""SseStream's fast path for the usual token event (one token's text, nothing else): it is
taken for those events, and for every event, usual or not, the stream ends up as chunk_parts'
full reading (SseStream._any_chunk) leaves it (issue 41: the parse path is most of the
client's Python per request)."""

from __future__ import annotations

import pytest

from cbbench.targets import sse
from cbbench.targets.sse import SseStream
from cbbench.targets.transport import HttpFailure

USUAL = [
    (False, {"choices": [{"index": 0, "text": " a", "finish_reason": None}]}),
    (False, {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": None,
                          "stop_reason": None}]}),
    (False, {"choices": [{"index": 0, "text": " a", "finish_reason": "length"}], "usage": None}),
    (True, {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "hi"},
                                             "finish_reason": None}]}),
    (True, {"choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": "stop"}]}),
]
# Every other shape: the full reading decides (usage, reasoning, tool calls, empty text, the
# role chunk, errors, odd types).
OTHERS = [
    (False, {"choices": [{"index": 0, "text": "", "finish_reason": None}]}),
    (False, {"choices": [{"index": 0, "text": None, "finish_reason": "length"}]}),
    (False, {"choices": [{"index": 0, "text": " a", "finish_reason": 3}]}),
    (False, {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 16}}),
    (False, {"choices": [{"index": 0, "text": " a"}], "usage": {"completion_tokens": 4}}),
    (False, {"choices": [{"index": 0, "text": " a"}], "usage": [1]}),
    (False, {"choices": [{"index": 0, "text": 7}]}),
    (False, {"choices": [" a"]}),
    (False, {"choices": {"0": 1}}),
    (False, {"object": "error", "message": "boom"}),
    (False, {"error": {"message": "boom"}, "choices": [{"text": "a"}]}),
    (False, [1, 2]),
    (True, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
    (True, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]}),
    (True, {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}),
    (True, {"choices": [{"index": 0, "delta": {"content": "a", "reasoning_content": "hm"}}]}),
    (True, {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{"}}]}}]}),
    (True, {"choices": [{"index": 0, "delta": {"content": 5}}]}),
    (True, {"choices": [{"index": 0, "delta": None, "finish_reason": "stop"}]}),
]


def _state(st: SseStream) -> tuple:
    return (st.times, st.kinds, st.running, st.pieces, st.answer_pieces, st.reasoning_pieces,
            st.finish_reason, st.usage, st.response_id, st.empty_events, st._running_now,
            {i: (c.id, c.name, c.arguments, c.event_idx) for i, c in st.tool_calls.items()})


def _outcome(step, st: SseStream, obj) -> tuple:
    try:
        step(obj, 1.5)
        step(obj, 2.5)  # a second event: the id and counts carry over
    except HttpFailure as e:
        return ("failed", e.error_type, str(e), _state(st))
    return ("ok", _state(st))


@pytest.mark.parametrize("keep_text", [False, True])
@pytest.mark.parametrize(("chat", "obj"), USUAL + OTHERS)
def test_the_fast_path_reads_as_the_full_reading(chat, obj, keep_text):
    fast, full = SseStream(chat, [], keep_text), SseStream(chat, [], keep_text)
    assert _outcome(fast._chunk, fast, obj) == _outcome(full._any_chunk, full, obj)


@pytest.mark.parametrize(("chat", "obj"), USUAL)
def test_the_usual_event_skips_the_full_reading(chat, obj, monkeypatch):
    def refused(*args):
        raise AssertionError("chunk_parts read a usual token event")

    monkeypatch.setattr(sse, "chunk_parts", refused)
    st = SseStream(chat, [])
    st._chunk(obj, 1.0)
    assert st.times == [1.0] and st.kinds == ["answer"]
