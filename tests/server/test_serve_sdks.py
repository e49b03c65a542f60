"""The Responses API and Anthropic's Messages on `cbbench serve --engine sim`, through the real
SDKs (issue 26): the openai SDK's ``responses.create(stream=True)`` and the anthropic SDK's
``messages.stream(...)`` read their events, and their text and usage match the request log;
reasoning, tool calls, the API key (Anthropic's x-api-key), errors in each API's shape, the body
limit, and a client that leaves mid-stream (the engine frees its request)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from helpers import POLL_S, SERVE_MODEL, START_TIMEOUT_S, logged_server, sim_options

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig
from cbbench.server.text import SIM_TOKEN_TEXT

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

KEY = "sdk-test-key"
REASONING = 3
MAX_TOKENS = 8
LONG = 3000  # ~8 s of 2.7 ms steps: far longer than the checks wait


@pytest.fixture
def served(tmp_path):
    """A guarded server with a request log; yields (url, read_log), read_log() the log's lines
    by id once the server stopped (the log is complete then)."""
    log = tmp_path / "serve.jsonl"
    with logged_server(log, lambda: build_serving_engine(sim_options()),
                       ServeConfig(api_key=KEY, request_log=str(log))) as served:
        yield served


def test_openai_sdk_streams_responses_as_the_log_says(served):
    run, read_log = served
    client = openai.OpenAI(base_url=run.url + "/v1", api_key=KEY, max_retries=0, timeout=30.0)
    stream = client.responses.create(model=SERVE_MODEL, input="hello there", stream=True,
                                     max_output_tokens=MAX_TOKENS,
                                     extra_body={"reasoning_tokens": REASONING})
    events = list(stream)
    client.close()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.incomplete"  # ran to max_output_tokens (OpenAI's event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == SIM_TOKEN_TEXT * REASONING
    assert text == SIM_TOKEN_TEXT * (MAX_TOKENS - REASONING)
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output_text == text
    u = final.usage
    line = read_log()[final.id]
    assert line["api"] == "responses" and line["stream"] is True and line["status"] == 200
    assert u.output_tokens == line["output_tokens"] == MAX_TOKENS
    assert u.input_tokens == line["prompt_tokens"]
    assert u.output_tokens_details.reasoning_tokens == line["reasoning_tokens"] == REASONING
    assert u.input_tokens_details.cached_tokens == line["cached_tokens"] == 0
    # One delta event per engine step: the log's events are the deltas, in kind and count.
    deltas = [e for e in events if e.type.endswith(".delta")]
    assert [k for _, _, k in line["events"]] == [
        "reasoning" if e.type == "response.reasoning_text.delta" else "answer" for e in deltas]
    assert sum(k for _, k, _ in line["events"]) == MAX_TOKENS


def test_openai_sdk_responses_tool_call_and_non_streaming(served):
    run, read_log = served
    client = openai.OpenAI(base_url=run.url + "/v1", api_key=KEY, max_retries=0, timeout=30.0)
    tools = [{"type": "function", "name": "grep", "parameters": {"type": "object"}}]
    r = client.responses.create(model=SERVE_MODEL, input=[{"role": "user", "content": "find"}],
                                instructions="be brief", max_output_tokens=4, tools=tools)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "grep" and r.status == "completed"
    assert json.loads(call.arguments) == {"input": SIM_TOKEN_TEXT * 4}
    # The call sent back with its output: a next turn, over the whole conversation.
    r2 = client.responses.create(model=SERVE_MODEL, max_output_tokens=2, input=[
        {"role": "user", "content": "find"},
        {"type": "function_call", "call_id": call.call_id, "name": "grep",
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "a b c"},
    ])
    assert r2.output_text == SIM_TOKEN_TEXT * 2
    # previous_response_id continues the stored conversation: the same prompt as sending it
    # all again as input; an id never stored (store false) is a 400.
    r3 = client.responses.create(model=SERVE_MODEL, max_output_tokens=2,
                                 previous_response_id=r.id, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "a b c"}])
    assert r3.previous_response_id == r.id and r3.output_text == SIM_TOKEN_TEXT * 2
    unstored = client.responses.create(model=SERVE_MODEL, input="x", max_output_tokens=1,
                                       store=False)
    with pytest.raises(openai.BadRequestError, match="previous response with id") as e:
        client.responses.create(model=SERVE_MODEL, input="y", previous_response_id=unstored.id)
    assert e.value.body["param"] == "previous_response_id"
    client.close()
    log = read_log()
    assert log[r3.id]["prompt_tokens"] == log[r2.id]["prompt_tokens"]
    assert log[r.id]["finish"] == "tool_calls" and log[r.id]["tool_call_tokens"] == 4
    assert log[r2.id]["prompt_tokens"] > log[r.id]["prompt_tokens"] + 4  # call + result
    assert r2.usage.input_tokens == log[r2.id]["prompt_tokens"]


def test_anthropic_sdk_streams_messages_as_the_log_says(served):
    run, read_log = served
    client = anthropic.Anthropic(base_url=run.url, api_key=KEY, max_retries=0, timeout=30.0)
    with client.messages.stream(model=SERVE_MODEL, max_tokens=MAX_TOKENS, system="terse",
                                messages=[{"role": "user", "content": "hi"}],
                                extra_body={"reasoning_tokens": REASONING}) as stream:
        text = "".join(stream.text_stream)
        msg = stream.get_final_message()
    client.close()
    thinking, answer = msg.content
    assert thinking.type == "thinking" and thinking.thinking == SIM_TOKEN_TEXT * REASONING
    assert answer.type == "text" and answer.text == text == SIM_TOKEN_TEXT * (MAX_TOKENS - REASONING)
    assert msg.stop_reason == "max_tokens"
    line = read_log()[msg.id]
    assert line["api"] == "anthropic" and line["finish"] == "length"
    assert msg.usage.output_tokens == line["output_tokens"] == MAX_TOKENS
    assert msg.usage.input_tokens == line["prompt_tokens"]
    assert line["reasoning_tokens"] == REASONING
    assert [k for _, _, k in line["events"]] == ["reasoning"] * REASONING + ["answer"] * (
        MAX_TOKENS - REASONING)


def test_anthropic_sdk_tool_use_and_errors(served):
    run, read_log = served
    client = anthropic.Anthropic(base_url=run.url, api_key=KEY, max_retries=0, timeout=30.0)
    msg = client.messages.create(model=SERVE_MODEL, max_tokens=4,
                                 messages=[{"role": "user", "content": "find"}],
                                 tools=[{"name": "grep", "input_schema": {"type": "object"}}])
    (use,) = msg.content
    assert use.type == "tool_use" and use.name == "grep" and msg.stop_reason == "tool_use"
    assert use.input == {"input": SIM_TOKEN_TEXT * 4}
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=2,
                               messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=SERVE_MODEL, max_tokens=0,
                               messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    bad = anthropic.Anthropic(base_url=run.url, api_key="wrong", max_retries=0, timeout=30.0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=SERVE_MODEL, max_tokens=2,
                            messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "authentication_error"
    assert "wrong" not in str(e.value.body)
    client.close()
    bad.close()
    big = httpx.post(run.url + "/v1/messages", headers={"x-api-key": KEY},
                     content=b"{" + b" " * (4 << 20) + b"}", timeout=30.0)
    assert big.status_code == 413
    assert big.json()["error"]["type"] == "request_too_large"
    assert read_log()[msg.id]["finish"] == "tool_calls"


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"input": "x", "max_output_tokens": LONG, "stream": True}),
    ("/v1/messages", {"model": SERVE_MODEL, "max_tokens": LONG, "stream": True,
                      "messages": [{"role": "user", "content": "x"}]}),
])
def test_a_client_that_leaves_mid_stream_is_aborted(served, path, body):
    run, read_log = served
    deltas = 0
    with httpx.Client(timeout=30.0) as c, c.stream("POST", run.url + path, json=body,
                                                   headers={"x-api-key": KEY}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            deltas += line.startswith("data:") and '"delta"' in line
            if deltas >= 3:
                # Read while the stream is open: the break itself closes the connection (the
                # dropped line iterator closes httpcore's stream), and on a loaded machine the
                # server's abort could free the blocks before a check after it (seen in CI).
                assert run.engine.snapshot().kv_blocks_used > 0
                break
    deadline = time.monotonic() + START_TIMEOUT_S  # the engine frees the aborted request
    while run.engine.snapshot().kv_blocks_used and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert run.engine.snapshot().kv_blocks_used == 0
    (line,) = read_log().values()
    assert line["finish"] == "abort" and 3 <= line["output_tokens"] < LONG


# ---- issue 37, rule 5: memory is bounded by bytes, not counts ---------------------------------
def test_the_responses_store_is_bounded_in_bytes():
    """The attack: 4,096 stored responses of a 0.9 MB input each (~888 KB of RSS apiece, ~3.6 GB
    in all), the store bounded by count only. Bounded in bytes, the newest kept; one larger
    than the whole budget is not kept at all."""
    from cbbench.server.apis.response_store import MESSAGE_OVERHEAD, ResponseStore
    from cbbench.server.protocol import ChatMessage

    big = 900_000
    store = ResponseStore(max_bytes=4 * (big + len("ok") + 2 * MESSAGE_OVERHEAD))
    for i in range(4096):
        store.put(f"resp_{i}", [ChatMessage(role="user", content="x" * big),
                                ChatMessage(role="assistant", content="ok")])
    assert len(store) == 4 and store.bytes <= store.max_bytes
    assert store.get("resp_4095") is not None and store.get("resp_0") is None
    store.put("huge", [ChatMessage(role="user", content="x" * (store.max_bytes + 1))])
    assert store.get("huge") is None and store.get("resp_4095") is not None


def test_serve_help_says_the_store_is_bounded_in_bytes():
    from typer.testing import CliRunner

    from cbbench.cli.app import app

    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["serve", "--help"]).output
    assert "--max-stored-response-bytes" in out and "bytes" in out


def test_anthropic_sdk_counts_tokens_as_the_message_costs(served):
    """``messages.count_tokens`` (POST /v1/messages/count_tokens, vLLM's route too) was a 404:
    it answers the prompt tokens ``messages.create`` of the same conversation is charged
    (prefix caching off: all of them are input_tokens); an unknown model is Anthropic's 404."""
    run, read_log = served
    client = anthropic.Anthropic(base_url=run.url, api_key=KEY, max_retries=0, timeout=30.0)
    convo = dict(model=SERVE_MODEL, system="terse", messages=[
        {"role": "user", "content": "find it"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "and more"}]}])
    counted = client.messages.count_tokens(**convo)
    msg = client.messages.create(max_tokens=1, **convo)
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.count_tokens(model="nope", messages=convo["messages"])
    client.close()
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    bad = anthropic.Anthropic(base_url=run.url, api_key="wrong", max_retries=0, timeout=30.0)
    with pytest.raises(anthropic.AuthenticationError) as e:  # Anthropic's shape, as /v1/messages
        bad.messages.count_tokens(**convo)
    bad.close()
    assert e.value.body["error"]["type"] == "authentication_error"
    assert counted.input_tokens == msg.usage.input_tokens == read_log()[msg.id]["prompt_tokens"]


def test_anthropic_sdk_thinking_enabled_thinks_its_budget(served):
    """``thinking={"type": "enabled", "budget_tokens": N}`` was dropped as an unknown field: no
    thinking block came back. The simulated model now thinks its budget (at most max_tokens),
    as the ``reasoning_tokens`` extension makes it; ``disabled`` (and no field) thinks not."""
    run, read_log = served
    client = anthropic.Anthropic(base_url=run.url, api_key=KEY, max_retries=0, timeout=30.0)
    ask = dict(model=SERVE_MODEL, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": "x"}])
    thought = client.messages.create(thinking={"type": "enabled", "budget_tokens": REASONING}, **ask)
    plain = client.messages.create(thinking={"type": "disabled"}, **ask)
    client.close()
    thinking, answer = thought.content
    assert thinking.type == "thinking" and thinking.thinking == SIM_TOKEN_TEXT * REASONING
    assert answer.text == SIM_TOKEN_TEXT * (MAX_TOKENS - REASONING)
    assert [b.type for b in plain.content] == ["text"]
    assert read_log()[thought.id]["reasoning_tokens"] == REASONING


def test_openai_sdk_retrieves_a_stored_response(served):
    """``responses.retrieve(id)`` (GET /v1/responses/{id}, vLLM's route too) was a 404 for a
    response the server had stored (``previous_response_id`` found it): it answers the response
    as created, streamed or not; one not stored (``store: false``) is a 404."""
    run, _ = served
    client = openai.OpenAI(base_url=run.url + "/v1", api_key=KEY, max_retries=0, timeout=30.0)
    made = client.responses.create(model=SERVE_MODEL, input="hi", max_output_tokens=MAX_TOKENS,
                                   extra_body={"reasoning_tokens": REASONING})
    streamed = [e for e in client.responses.create(model=SERVE_MODEL, input="hi", stream=True,
                                                    max_output_tokens=2)][-1].response
    unstored = client.responses.create(model=SERVE_MODEL, input="x", max_output_tokens=1,
                                       store=False)
    got, got_streamed = client.responses.retrieve(made.id), client.responses.retrieve(streamed.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    client.close()
    assert got.model_dump() == made.model_dump()
    assert got_streamed.model_dump() == streamed.model_dump()
