"""Every body `cbbench serve` returns, held to OpenAI's published OpenAPI specification
(tests/data/openai/: an extract of its components/schemas, README there): completions, chat
completions and each of their stream chunks, the Responses API's object and stream events,
/v1/models, /v1/embeddings, and the error object of every 4xx. The SDKs' pydantic models are
lenient; the spec's required fields, enums, nullability and types are not. A field vLLM adds
beyond the spec is fine (the spec allows additional properties)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from helpers import SERVE_MODEL, sim_options, start_server

from cbbench.cli.serve import build_serving_engine

jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = Path(__file__).parents[1] / "data" / "openai" / "schemas.json"
CHAT = [{"role": "user", "content": "hi"}]


def _json_schema(node):
    """OpenAPI's schema dialect as JSON Schema: ``nullable: true`` (3.0's, still in the 3.1
    document) becomes "this schema, or null"; everything else is JSON Schema already."""
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k != "nullable"}
    return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") else out


def _vllm_divergences(schemas: dict) -> None:
    """Where vLLM and the spec differ, vLLM wins (cbbench serves vLLM's API):
    - the spec's Responses usage requires ``input_tokens_details.cache_write_tokens`` (added
      2026-07); vLLM's InputTokensDetails (responses/protocol.py) has ``cached_tokens`` only.
    - the spec's Response.usage is not nullable; vLLM's ResponsesResponse (and OpenAI's own
      response.created) sends ``usage: null`` while the response is in progress.
    - the spec has no schema of a legacy completions stream chunk (it points to
      CreateCompletionResponse, whose finish_reason is not nullable); OpenAI and vLLM send
      ``finish_reason: null`` on every chunk but the last: CompletionStreamChunk allows it."""
    schemas["ResponseUsage"]["properties"]["input_tokens_details"]["required"].remove(
        "cache_write_tokens")
    props = next(p["properties"] for p in schemas["Response"]["allOf"]
                 if "usage" in p.get("properties", {}))
    props["usage"] = {"anyOf": [props["usage"], {"type": "null"}]}
    chunk = json.loads(json.dumps(schemas["CreateCompletionResponse"]))
    reason = chunk["properties"]["choices"]["items"]["properties"]["finish_reason"]
    chunk["properties"]["choices"]["items"]["properties"]["finish_reason"] = {
        "anyOf": [reason, {"type": "null"}]}
    schemas["CompletionStreamChunk"] = chunk


def _stream_event_schemas(schemas: dict) -> dict[str, str]:
    """Each Responses stream event's own schema by its ``type`` (ResponseStreamEvent is an
    anyOf of them all: validating against the one that applies names the real error)."""
    by_type = {}
    for ref in schemas["ResponseStreamEvent"]["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        by_type[schemas[name]["properties"]["type"]["enum"][0]] = name
    return by_type


@pytest.fixture(scope="module")
def validate():
    schemas = _json_schema(json.loads(SCHEMAS.read_text()))
    _vllm_divergences(schemas)
    event_schema = _stream_event_schemas(schemas)

    def check(body, name: str) -> None:
        if name == "ResponseStreamEvent":
            name = event_schema[body["type"]]
        # $refs are "#/components/schemas/X": resolved against this root document.
        root = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": schemas}}
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(root).iter_errors(body))
        assert error is None, f"{name}: {error.message} at {list(error.absolute_path)}"

    return check


@pytest.fixture(scope="module")
def client():
    run = start_server(lambda: build_serving_engine(sim_options()))
    with httpx.Client(base_url=run.url, timeout=30.0) as c:
        yield c
    run.stop()


def _events(r: httpx.Response) -> list[dict]:
    """The JSON of each SSE data line, the [DONE] sentinel left out."""
    assert r.status_code == 200, r.text
    lines = [ln[len("data:"):].strip() for ln in r.text.splitlines() if ln.startswith("data:")]
    return [json.loads(d) for d in lines if d != "[DONE]"]


BODIES = {
    "completion": ("/v1/completions", {"prompt": "hi", "max_tokens": 3},
                   "CreateCompletionResponse"),
    "completion_tokens_prompt": ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2},
                                 "CreateCompletionResponse"),
    "chat": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 3},
             "CreateChatCompletionResponse"),
    "chat_tool_call": ("/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 3, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        "CreateChatCompletionResponse"),
    "embeddings": ("/v1/embeddings", {"input": ["one two", "three"]}, "CreateEmbeddingResponse"),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 3}, "Response"),
    "responses_tool_call": ("/v1/responses", {
        "input": "hi", "max_output_tokens": 3, "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": {}}]}, "Response"),
    "responses_reasoning": ("/v1/responses", {"input": "hi", "max_output_tokens": 4,
                                              "reasoning_tokens": 2}, "Response"),
}


@pytest.mark.parametrize("case", sorted(BODIES))
def test_body_meets_the_spec(client, validate, case):
    path, body, schema = BODIES[case]
    r = client.post(path, json={"model": SERVE_MODEL, **body})
    assert r.status_code == 200, r.text
    validate(r.json(), schema)


def test_models_list_and_a_stored_response_meet_the_spec(client, validate):
    validate(client.get("/v1/models").json(), "ListModelsResponse")
    made = client.post("/v1/responses", json={"model": SERVE_MODEL, "input": "hi",
                                              "max_output_tokens": 2}).json()
    validate(client.get(f"/v1/responses/{made['id']}").json(), "Response")


STREAMS = {
    "completion": ("/v1/completions", {"prompt": "hi", "max_tokens": 3},
                   "CompletionStreamChunk"),
    "completion_usage": ("/v1/completions", {
        "prompt": "hi", "max_tokens": 3, "stream_options": {"include_usage": True}},
        "CompletionStreamChunk"),
    "chat": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 3},
             "CreateChatCompletionStreamResponse"),
    "chat_usage": ("/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 3, "stream_options": {"include_usage": True}},
        "CreateChatCompletionStreamResponse"),
    "chat_continuous_usage": ("/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 3,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        "CreateChatCompletionStreamResponse"),
    "chat_tool_call": ("/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 3, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        "CreateChatCompletionStreamResponse"),
    "chat_reasoning": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4,
                                                "reasoning_tokens": 2},
                       "CreateChatCompletionStreamResponse"),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 3},
                  "ResponseStreamEvent"),
    "responses_tool_call": ("/v1/responses", {
        "input": "hi", "max_output_tokens": 3, "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": {}}]}, "ResponseStreamEvent"),
    "responses_reasoning": ("/v1/responses", {"input": "hi", "max_output_tokens": 4,
                                              "reasoning_tokens": 2}, "ResponseStreamEvent"),
}


@pytest.mark.parametrize("case", sorted(STREAMS))
def test_each_stream_event_meets_the_spec(client, validate, case):
    path, body, schema = STREAMS[case]
    events = _events(client.post(path, json={"model": SERVE_MODEL, "stream": True, **body}))
    assert len(events) >= 3
    for event in events:
        validate(event, schema)


ERRORS = {
    "bad_json": ("/v1/chat/completions", b"{x"),
    "unknown_model": ("/v1/chat/completions", {"model": "nope", "messages": CHAT}),
    "max_tokens_too_large": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 10**7}),
    "bad_temperature": ("/v1/chat/completions", {"messages": CHAT, "temperature": -1}),
    "temperature_not_a_number": ("/v1/completions", {"prompt": "x", "temperature": "hot"}),
    "missing_messages": ("/v1/chat/completions", {}),
    "missing_prompt": ("/v1/completions", {}),
    "unsupported_n": ("/v1/chat/completions", {"messages": CHAT, "n": 2}),
    "body_not_an_object": ("/v1/completions", [1, 2]),
    "embeddings_missing_input": ("/v1/embeddings", {}),
    "responses_missing_input": ("/v1/responses", {}),
    "responses_unknown_previous": ("/v1/responses", {"input": "x",
                                                     "previous_response_id": "resp_x"}),
    "responses_get_unknown": ("/v1/responses/resp_nope", None),
    "body_too_large": ("/v1/completions", {"prompt": "x" * (1 << 22)}),
    "unknown_path": ("/v1/nothing", None),
    "wrong_method": ("/v1/chat/completions", None),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_every_4xx_is_an_openai_error(client, validate, case):
    path, body = ERRORS[case]
    if body is None:
        r = client.get(path)
    elif isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json={"model": SERVE_MODEL, **body} if isinstance(body, dict)
                        else body)
    assert 400 <= r.status_code < 500, r.text
    validate(r.json(), "ErrorResponse")
