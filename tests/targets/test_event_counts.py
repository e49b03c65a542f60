"""The stream parser's kinds and the per-event token counts (issue 24), on hand-written
streams."""

from __future__ import annotations

import json

from cbbench.analysis.records import RequestRecord
from cbbench.targets.checks import event_count_methods
from cbbench.targets.event_counts import count_events
from cbbench.targets.sse import SseStream


def feed(chunks: list[dict], chat: bool = True, keep_text: bool = False):
    rec = RequestRecord(id=0, prompt_tokens=3, output_tokens=0, intended_start_s=0.0)
    st = SseStream(chat, rec.token_times_s, keep_text=keep_text)
    for i, c in enumerate(chunks):
        st.feed(b"data: " + json.dumps(c).encode() + b"\n\n", 0.1 * (i + 1))
    st.feed(b"data: [DONE]\n\n", 9.0)
    st.close(9.0)
    count_events(rec, st, None)
    return rec, st


def delta(d: dict, usage: int | None = None, finish=None) -> dict:
    c = {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}
    if usage is not None:
        c["usage"] = {"prompt_tokens": 3, "completion_tokens": usage}
    return c


def test_continuous_usage_counts_each_event_and_splits_reasoning_at_the_boundary():
    rec, st = feed([
        delta({"role": "assistant", "content": ""}),
        delta({"reasoning_content": " a b"}, usage=2),
        delta({"content": ""}, usage=3),  # a token with no text yet: counts with the next
        delta({"reasoning_content": " c", "content": " d e"}, usage=6),
        delta({"content": " f"}, usage=7, finish="stop"),
        {"id": "chatcmpl-1", "choices": [], "usage": {
            "prompt_tokens": 3, "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 2},
            "completion_tokens_details": {"reasoning_tokens": 4}}},
    ])
    assert st.kinds == ["reasoning", "reasoning+answer", "answer"]
    assert rec.event_tokens == [2, 4, 1] and rec.event_tokens_method == "continuous_usage"
    assert rec.reasoning_tokens == 4  # usage's exact figure
    assert rec.first_output_s == rec.token_times_s[1]  # the boundary event holds answer text
    assert rec.cached_tokens == 2


def test_no_usage_is_one_per_event_and_warned_when_usage_shows_more():
    rec, _ = feed([delta({"content": " a b"}), delta({"content": " c"}, finish="length"),
                   {"choices": [], "usage": {"completion_tokens": 3}}])
    assert rec.event_tokens == [1, 1] and rec.event_tokens_method == "one_per_event"
    assert rec.cached_tokens is None and rec.reasoning_tokens == 0
    rec.output_token_counts = {"events": 2, "usage": 3}
    methods, warning = event_count_methods([rec])
    assert methods == {"one_per_event": 1}
    assert warning and "more tokens (usage) than stream events" in warning


def test_reasoning_field_named_reasoning_and_no_usage_detail():
    rec, _ = feed([delta({"reasoning": " a"}, usage=1), delta({"reasoning": " b"}, usage=2),
                   delta({"content": " c"}, usage=3, finish="stop")])
    assert rec.reasoning_tokens == 2 and rec.first_output_s == rec.token_times_s[2]


def test_tool_call_deltas_are_tool_tokens():
    rec, st = feed([
        delta({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "grep", "arguments": "{\"q\": "}}]}, usage=2),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": "\"x\"}"}}]}, usage=3),
        delta({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                               "function": {"name": "ls", "arguments": "{}"}}]}, usage=4,
              finish="tool_calls"),
    ])
    assert st.kinds == ["tool", "tool", "tool"]
    assert rec.tool_calls == [
        {"id": "call_1", "name": "grep", "argument_tokens": 3},
        {"id": "call_2", "name": "ls", "argument_tokens": 1},
    ]
    assert rec.first_output_s == rec.token_times_s[0]


def test_completions_text_has_no_reasoning_figure():
    rec, _ = feed([{"id": "cmpl-1", "choices": [{"index": 0, "text": " a", "finish_reason":
                                                  "length"}]}], chat=False)
    assert rec.reasoning_tokens is None and rec.event_tokens == [1]


def test_tokenizer_counts_each_event_without_usage(tmp_path):
    from fake_openai import make_tiny_tokenizer

    from cbbench.load.prompts import load_tokenizer

    tok = load_tokenizer(make_tiny_tokenizer(tmp_path / "tokenizer.json"))
    rec = RequestRecord(id=0, prompt_tokens=3, output_tokens=0, intended_start_s=0.0)
    st = SseStream(True, rec.token_times_s, keep_text=True)
    for i, d in enumerate([{"reasoning_content": " a b c"}, {"reasoning_content": " d",
                                                              "content": " e f"},
                           {"content": " g"}]):
        st.feed(b"data: " + json.dumps(delta(d, finish="stop" if i == 2 else None)).encode()
                + b"\n\n", 0.1 * (i + 1))
    st.feed(b"data: [DONE]\n\n", 1.0)
    st.close(1.0)
    count_events(rec, st, tok)
    # Word-level: each word one token ([UNK] for words outside the pool), no BOS per event.
    assert rec.event_tokens == [3, 3, 1] and rec.event_tokens_method == "tokenizer"
    assert rec.reasoning_tokens == 4  # the boundary event's reasoning text is one word
