"""`cbbench run --api anthropic|responses` against the streams the providers document (Anthropic's
"Streaming Messages": message_start, content_block_start, pings anywhere, the deltas,
message_delta's cumulative usage and stop_reason, message_stop, an `error` event after a 200;
OpenAI's Responses streaming events, as its SDK types them), paced by the fake: TTFT is the
first generated text (never message_start, a ping or a block's start sent a gap before it), one
time a content delta, output tokens from the final usage, the stop reason in chat's words."""

from __future__ import annotations

import json

import pytest
from fake_openai import MODEL
from helpers import invoke_app
from test_server_stream_shapes import GAP_S, PacedFake

N = 2


def ev(obj: dict) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode()


PING = ev({"type": "ping"})


def a_start(inp=25) -> bytes:
    return ev({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": MODEL,
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": inp, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 1}}})


def a_block(i: int, block: dict) -> bytes:
    return ev({"type": "content_block_start", "index": i, "content_block": block})


def a_delta(i: int, delta: dict) -> bytes:
    return ev({"type": "content_block_delta", "index": i, "delta": delta})


def a_text(i: int, text: str) -> bytes:
    return a_delta(i, {"type": "text_delta", "text": text})


def a_stop(i: int) -> bytes:
    return ev({"type": "content_block_stop", "index": i})


def a_end(reason: str, out: int) -> list[bytes]:
    return [ev({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": out}}), ev({"type": "message_stop"})]


def r_resp(status="in_progress", usage=None, **extra) -> dict:
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status,
            "model": MODEL, "output": [], "usage": usage, **extra}


def r_usage(out: int, reasoning: int = 0) -> dict:
    return {"input_tokens": 8, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": 8 + out}


def r_ev(kind: str, **fields) -> bytes:
    return ev({"type": kind, **fields})


R_LEAD = [r_ev("response.created", response=r_resp()),
          r_ev("response.in_progress", response=r_resp())]


def r_msg_lead(idx: int = 0) -> list[bytes]:
    return [r_ev("response.output_item.added", output_index=idx, item={
                "id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant",
                "content": []}),
            r_ev("response.content_part.added", item_id="msg_1", output_index=idx,
                 content_index=0, part={"type": "output_text", "text": "", "annotations": []})]


def r_text(t: str, idx: int = 0) -> bytes:
    return r_ev("response.output_text.delta", item_id="msg_1", output_index=idx,
                content_index=0, delta=t, logprobs=[])


ApiFake = PacedFake  # lead at once, texts GAP_S apart, tail at once


def run(tmp_path, api, lead, texts, tail, out_len=4):
    out = tmp_path / "r.json"
    with ApiFake(lead, texts, tail) as s:
        res = invoke_app([
            "run", "--endpoint", s.url, "--served-model", MODEL, "--api", api,
            "--workload", "random", "--input-len", "8", "--output-len", str(out_len),
            "--num-requests", str(N), "--max-concurrency", "1", "--request-rate", "inf",
            "--output", str(out), "--quiet", "--save-detailed", "--max-error-rate", "1",
        ])
    return res, (json.loads(out.read_text()) if out.exists() else None)


W = [" a", " b", " c", " d"]
A_LEAD = [a_start(), a_block(0, {"type": "text", "text": ""}), PING]  # a gap before any text
A_TEXTS = [a_text(0, W[0]), a_text(0, W[1]), PING + a_text(0, W[2]), a_text(0, W[3])]
R_TEXTS = [r_text(w) for w in W]


def r_final(kind: str, status: str, out: int, reason: str | None = None) -> bytes:
    details = {"incomplete_details": {"reason": reason}} if reason else {}
    return r_ev(kind, response=r_resp(status, r_usage(out), **details))


# name: (api, lead, texts (GAP_S apart), tail, finish_reason, output_tokens, text events)
STREAMS = {
    # Anthropic's documented stream, a ping before the first text and one between two deltas.
    "anthropic end_turn": ("anthropic", A_LEAD, A_TEXTS, [a_stop(0), *a_end("end_turn", 4)],
                           "stop", 4, 4),
    "anthropic stop_sequence": ("anthropic", A_LEAD, A_TEXTS,
                                [a_stop(0), *a_end("stop_sequence", 4)], "stop", 4, 4),
    "anthropic max_tokens": ("anthropic", A_LEAD, A_TEXTS, [a_stop(0), *a_end("max_tokens", 4)],
                             "length", 4, 4),
    # The output cut by the context window is a length finish; a refusal (its streaming
    # classifiers stopped the answer) is chat's content_filter (Vercel's AI SDK maps them so).
    "anthropic model_context_window_exceeded": (
        "anthropic", A_LEAD, A_TEXTS, [a_stop(0), *a_end("model_context_window_exceeded", 4)],
        "length", 4, 4),
    "anthropic refusal": ("anthropic", A_LEAD, A_TEXTS, [a_stop(0), *a_end("refusal", 4)],
                          "content_filter", 4, 4),
    # A tool call: its block's start is no token, its first input_json_delta is "".
    "anthropic tool_use": (
        "anthropic", [a_start(), a_block(0, {"type": "tool_use", "id": "toolu_1", "name": "f",
                                             "input": {}}),
                      a_delta(0, {"type": "input_json_delta", "partial_json": ""})],
        [a_delta(0, {"type": "input_json_delta", "partial_json": p}) for p in ('{"a":', "1}")],
        [a_stop(0), *a_end("tool_use", 5)], "tool_calls", 5, 2),
    # OpenAI's Responses stream: created, in_progress, the item and part added, then the text.
    "responses completed": ("responses", R_LEAD + r_msg_lead(), R_TEXTS,
                            [r_final("response.completed", "completed", 4)], "stop", 4, 4),
    "responses max_output_tokens": (
        "responses", R_LEAD + r_msg_lead(), R_TEXTS,
        [r_final("response.incomplete", "incomplete", 4, "max_output_tokens")], "length", 4, 4),
    # Incomplete for its content filter is no length finish.
    "responses content_filter": (
        "responses", R_LEAD + r_msg_lead(), R_TEXTS,
        [r_final("response.incomplete", "incomplete", 4, "content_filter")],
        "content_filter", 4, 4),
    # A call cut by max_output_tokens is a length finish, as chat's finish_reason says of it.
    "responses call cut": (
        "responses", R_LEAD + [r_ev("response.output_item.added", output_index=0, item={
            "id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f",
            "arguments": ""})],
        [r_ev("response.function_call_arguments.delta", item_id="fc_1", output_index=0,
              delta=p) for p in ('{"a":', "1")],
        [r_final("response.incomplete", "incomplete", 4, "max_output_tokens")], "length", 4, 2),
}


# A refusal is the model's output (OpenAI's ResponseRefusalDeltaEvent): its deltas are the
# tokens, timed as text is; the done event and the refusal part's start are none.
R_REFUSAL_LEAD = R_LEAD + [
    r_ev("response.output_item.added", output_index=0, item={
        "id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant",
        "content": []}),
    r_ev("response.content_part.added", item_id="msg_1", output_index=0, content_index=0,
         part={"type": "refusal", "refusal": ""})]
STREAMS["responses refusal"] = (
    "responses", R_REFUSAL_LEAD,
    [r_ev("response.refusal.delta", item_id="msg_1", output_index=0, content_index=0, delta=w)
     for w in W],
    [r_ev("response.refusal.done", item_id="msg_1", output_index=0, content_index=0,
          refusal="".join(W)), r_final("response.completed", "completed", 4)], "stop", 4, 4)

# A server tool (the SDK's ServerToolUseBlock: web_search...) streams its input as a tool_use
# block does: generated tokens, but the server runs it and its result comes as a
# web_search_tool_result block (no deltas): no call of the client's to answer.
A_SERVER_TOOL_LEAD = [
    a_start(), a_block(0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                           "input": {}}),
    a_delta(0, {"type": "input_json_delta", "partial_json": ""})]
A_SERVER_TOOL_TEXTS = [a_delta(0, {"type": "input_json_delta", "partial_json": p})
                       for p in ('{"query":', ' "x"}')] + [
    a_stop(0) + a_block(1, {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                            "content": []}) + a_stop(1)
    + a_block(2, {"type": "text", "text": ""}) + a_text(2, W[0]), a_text(2, W[1])]
STREAMS["anthropic server_tool_use"] = (
    "anthropic", A_SERVER_TOOL_LEAD, A_SERVER_TOOL_TEXTS, [a_stop(2), *a_end("end_turn", 4)],
    "stop", 4, 4)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_each_documented_stream_gives_its_true_figures(name, tmp_path):
    api, lead, texts, tail, finish, out_tokens, events = STREAMS[name]
    res, result = run(tmp_path, api, lead, texts, tail)
    assert res.exit_code == 0 and result is not None, res.output
    for r in result["requests"]:
        assert r["error"] is None, r["error"]
        assert r["finish_reason"] == finish
        assert r["output_tokens"] == out_tokens and r["output_tokens_method"] == "usage"
        assert len(r["token_times_s"]) == events  # one time a content delta, pings none
        # The first generated text, not the message's start, a ping or a block's start.
        assert r["token_times_s"][0] - r["send_s"] >= GAP_S * 0.9


def test_a_server_tool_is_no_call_of_the_clients(tmp_path):
    """Its input's tokens are timed, but the record lists no (unnamed) tool call: a next turn
    would send it back as the client's call, with a tool_result Anthropic refuses."""
    _, lead, texts, tail, *_ = STREAMS["anthropic server_tool_use"]
    res, result = run(tmp_path, "anthropic", lead, texts, tail)
    assert res.exit_code == 0 and result is not None, res.output
    for r in result["requests"]:
        assert r["error"] is None, r["error"]
        assert r.get("tool_calls") is None, r["tool_calls"]
