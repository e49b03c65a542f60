"""The Responses and Anthropic stream parsers (issue 26) on hand-written streams in each API's
shape (split across reads mid-line, as a network delivers them): token events, kinds, tool
calls, the usage read as chat's, the finish reason, errors as one line; and the bad input
`cbbench run --api` refuses in one line (exit 2)."""

from __future__ import annotations

import json

import pytest
from helpers import invoke_app

from cbbench.targets.apis.anthropic_stream import AnthropicStream, headers, to_messages
from cbbench.targets.apis.responses_stream import ResponsesStream, input_items
from cbbench.targets.transport import HttpFailure


def sse(*events: dict) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def feed_in_pieces(st, data: bytes, size: int = 7) -> None:
    for i in range(0, len(data), size):
        st.feed(data[i:i + size], float(i))
    st.close(float(len(data)))


def test_responses_stream_as_vllm_writes_it():
    resp = {"id": "resp_1", "status": "in_progress", "output": []}
    final = {"id": "resp_1", "status": "incomplete",
             "incomplete_details": {"reason": "max_output_tokens"},
             "usage": {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 4},
                       "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 1}}}
    data = sse(
        {"type": "response.created", "response": resp},
        {"type": "response.in_progress", "response": resp},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning"}},
        {"type": "response.reasoning_text.delta", "delta": "hm", "output_index": 0},
        {"type": "response.output_item.added", "output_index": 1, "item": {"type": "message"}},
        {"type": "response.output_text.delta", "delta": "", "output_index": 1},
        {"type": "response.output_text.delta", "delta": " a", "output_index": 1},
        {"type": "response.output_text.delta", "delta": " b", "output_index": 1},
        {"type": "response.output_text.done", "text": " a b", "output_index": 1},
        {"type": "response.completed", "response": final},  # vLLM: completed, status incomplete
    )
    st = ResponsesStream([], keep_text=True)
    feed_in_pieces(st, data)
    assert st.response_id == "resp_1" and st.done
    assert st.kinds == ["reasoning", "answer", "answer"] and len(st.times) == 3
    assert st.empty_events == 1 and st.answer_text() == " a b"
    assert st.usage == {"prompt_tokens": 11, "completion_tokens": 3,
                        "prompt_tokens_details": {"cached_tokens": 4},
                        "completion_tokens_details": {"reasoning_tokens": 1}}
    assert st.finish_reason == "length"


def test_responses_tool_call_and_errors():
    data = sse(
        {"type": "response.created", "response": {"id": "resp_2"}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"type": "function_call", "call_id": "call_9", "name": "grep"}},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"q":'},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '"x"}'},
        {"type": "response.completed", "response": {"id": "resp_2", "status": "completed"}},
    )
    st = ResponsesStream([])
    feed_in_pieces(st, data)
    assert st.kinds == ["tool", "tool"] and st.finish_reason == "tool_calls"
    assert st.assistant_message()["tool_calls"] == [
        {"id": "call_9", "type": "function", "function": {"name": "grep", "arguments": '{"q":"x"}'}}]
    for bad, msg in (({"type": "error", "code": "server_error", "message": "boom"}, "boom"),
                     ({"type": "response.failed", "response": {"error": {"message": "gone"}}},
                      "gone")):
        st = ResponsesStream([])
        with pytest.raises(HttpFailure, match=f"server error event: {msg}") as e:
            st.feed(sse(bad), 0.0)
        assert e.value.error_type == "bad_event"
    st = ResponsesStream([])
    st.feed(sse({"type": "response.output_text.delta", "delta": "x"}), 0.0)
    with pytest.raises(HttpFailure) as e:  # no response.completed: cut
        st.close(1.0)
    assert e.value.error_type == "stream_cut"


def test_responses_input_from_a_chat_history():
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    assert input_items(history) == [
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "r"}]


def test_anthropic_stream_with_thinking_text_and_tool_use():
    data = sse(
        {"type": "message_start", "message": {"id": "msg_1", "usage": {
            "input_tokens": 5, "cache_read_input_tokens": 7, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "mm"}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": "sig"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_start", "index": 2,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {}}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 3}},
        {"type": "message_stop"},
    )
    st = AnthropicStream([], keep_text=True)
    feed_in_pieces(st, data, size=5)
    assert st.response_id == "msg_1" and st.done
    assert st.kinds == ["reasoning", "answer", "tool"]  # the signature is no token
    assert st.usage == {"prompt_tokens": 12, "completion_tokens": 3,
                        "prompt_tokens_details": {"cached_tokens": 7}}
    assert st.finish_reason == "tool_calls"
    (call,) = st.assistant_message()["tool_calls"]
    assert call["id"] == "toolu_1" and call["function"] == {"name": "grep", "arguments": '{"a": 1}'}


def test_anthropic_message_delta_counts_are_cumulative():
    """message_delta's usage states every count so far (Anthropic's, and cbbench serve's): a
    count it states replaces message_start's, one it leaves out keeps it (the SDK's rule)."""
    text = {"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "hi"}}

    def usage(start: dict, delta: dict) -> dict | None:
        st = AnthropicStream([])
        st.feed(sse({"type": "message_start", "message": {"id": "msg_1", "usage": start}},
                    text, {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": delta}, {"type": "message_stop"}), 0.0)
        return st.usage

    assert usage({"input_tokens": 62, "output_tokens": 0},
                 {"input_tokens": 14, "cache_read_input_tokens": 48, "output_tokens": 2}) == {
        "prompt_tokens": 62, "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 48}}
    assert usage({"input_tokens": 5, "cache_read_input_tokens": 7, "output_tokens": 0},
                 {"output_tokens": 3}) == {
        "prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 7}}
    # A usage with a count of the wrong type is not read: message_start's stand.
    assert usage({"input_tokens": 5, "output_tokens": 0},
                 {"input_tokens": "9", "output_tokens": 3}) == {
        "prompt_tokens": 5, "completion_tokens": 3}


def test_anthropic_errors_are_one_line():
    body = json.dumps({"type": "error", "error": {"type": "authentication_error",
                                                  "message": "invalid x-api-key"}}).encode()
    assert AnthropicStream.error_text(body) == "authentication_error: invalid x-api-key"
    assert AnthropicStream.error_text(b"<html>502</html>") == "<html>502</html>"
    st = AnthropicStream([])
    with pytest.raises(HttpFailure, match="server error event: overloaded_error: busy"):
        st.feed(sse({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
                0.0)


@pytest.mark.parametrize("delta_type", [["text_delta"], {"a": 1}, None, 3])
def test_anthropic_delta_without_a_string_type_is_a_bad_event(delta_type):
    # A list or an object as the delta's type was a TypeError (unhashable) out of the parser,
    # not the request's one-line failure.
    st = AnthropicStream([])
    event = {"type": "content_block_delta", "index": 0,
             "delta": {"type": delta_type, "text": "x"}}
    with pytest.raises(HttpFailure, match="unexpected chunk shape") as e:
        st.feed(sse(event), 0.0)
    assert e.value.error_type == "bad_event"
    assert st.kinds == []  # nothing counted as a token


def test_anthropic_request_shape():
    assert headers({}) == {"anthropic-version": "2023-06-01"}
    assert headers({"Anthropic-Version": "2024-01-01"}) == {}  # the user's wins
    system, msgs = to_messages([
        {"role": "system", "content": "s"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "r"}])
    assert system == "s"
    assert msgs == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {"x": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "r"}]}]


@pytest.mark.parametrize("api", ["responses", "anthropic"])
def test_token_ids_the_api_cannot_take_are_one_line(tmp_path, api):
    wl = tmp_path / "ids.jsonl"
    wl.write_text(json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 4}) + "\n")
    res = invoke_app([
        "run", "--endpoint", "http://127.0.0.1:9", "--api", api, "--workload", str(wl),
        "--num-requests", "1", "--output", str(tmp_path / "r.json")])
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"cbbench: error: request 0 carries token ids, which the {api} API cannot take: give "
        "--tokenizer (a tokenizer.json) to decode them, or use --api completions")
    assert not (tmp_path / "r.json").exists()


def test_an_unknown_api_is_one_line(tmp_path):
    res = invoke_app(["run", "--endpoint", "http://127.0.0.1:9", "--api", "grpc",
                      "--num-requests", "1", "--output", str(tmp_path / "r.json")])
    assert res.exit_code == 2
    assert res.output.strip() == (
        "cbbench: error: unknown --api 'grpc': use completions, chat, responses, anthropic, "
        "embeddings, rerank")
