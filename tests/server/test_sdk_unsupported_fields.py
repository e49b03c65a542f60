"""The SDKs' request fields `cbbench serve` cannot honour: a 400 the SDK raises as its
``BadRequestError`` naming the field (vLLM's answer where vLLM refuses the request too), never a
200 whose output ignored the field (the eighth review held serve to the openai and anthropic
SDKs)."""

from __future__ import annotations

import pytest
from helpers import SERVE_MODEL, sim_options, start_server

from cbbench.cli.serve import build_serving_engine

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served():
    run = start_server(lambda: build_serving_engine(sim_options()))
    yield run
    run.stop()


@pytest.fixture(scope="module")
def sdk(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=30.0)
    yield client
    client.close()


def _refused(call, param: str, words: str) -> None:
    with pytest.raises(openai.BadRequestError, match=words) as e:
        call()
    assert e.value.status_code == 400 and e.value.body["param"] == param


@pytest.mark.parametrize("fmt", [
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
])
def test_a_structured_output_format_is_refused_not_ignored(sdk, fmt):
    """response_format asks for JSON; the server's output is not constrained, so a 200 was text
    the client's JSON parse (``chat.completions.parse``) fails on."""
    _refused(lambda: sdk.chat.completions.create(model=SERVE_MODEL, messages=MESSAGES,
                                                 max_tokens=2, response_format=fmt),
             "response_format", "response_format")
    _refused(lambda: sdk.responses.create(model=SERVE_MODEL, input="hi", max_output_tokens=2,
                                          text={"format": {**fmt, **fmt.get("json_schema", {})}}),
             "text.format", "text.format")
    # Plain text (the default) is what the server writes: accepted.
    r = sdk.chat.completions.create(model=SERVE_MODEL, messages=MESSAGES, max_tokens=2,
                                    response_format={"type": "text"})
    assert r.usage.completion_tokens == 2
    r2 = sdk.responses.create(model=SERVE_MODEL, input="hi", max_output_tokens=2,
                              text={"format": {"type": "text"}})
    assert r2.usage.output_tokens == 2


def test_logprobs_asked_for_are_refused_not_left_out(sdk):
    """``logprobs=0`` asks for the chosen tokens' logprobs (OpenAI's and vLLM's reading: 0 top
    alternatives), and chat's ``top_logprobs`` without ``logprobs`` is vLLM's 400: both were a
    200 with ``logprobs: None``."""
    _refused(lambda: sdk.completions.create(model=SERVE_MODEL, prompt="hi", max_tokens=2,
                                            logprobs=0), "logprobs", "logprobs")
    _refused(lambda: sdk.chat.completions.create(model=SERVE_MODEL, messages=MESSAGES,
                                                 max_tokens=2, top_logprobs=2),
             "top_logprobs", "`logprobs` must be set to true")
    r = sdk.chat.completions.create(model=SERVE_MODEL, messages=MESSAGES, max_tokens=2,
                                    logprobs=False)
    assert r.choices[0].logprobs is None and r.usage.completion_tokens == 2


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_stream_options_without_stream_is_vllms_400(sdk, api):
    """vLLM refuses stream_options on a request that does not stream (its words below); a 200
    told a client that asked for usage chunks nothing of why none came."""
    create = (sdk.chat.completions.create if api == "chat" else sdk.completions.create)
    body = {"messages": MESSAGES} if api == "chat" else {"prompt": "hi"}
    _refused(lambda: create(model=SERVE_MODEL, max_tokens=2, stream=False,
                            stream_options={"include_usage": True}, **body),
             "stream_options", "only be defined when `stream=True`")
    # An empty object is no option (vLLM's test is the value's truth): accepted.
    assert create(model=SERVE_MODEL, max_tokens=2, stream_options={}, **body).usage.total_tokens


def test_responses_logprobs_asked_for_are_refused(sdk):
    """``include: ["message.output_text.logprobs"]`` asks for them; the answer was
    ``logprobs: []``, read as a text of no tokens."""
    _refused(lambda: sdk.responses.create(model=SERVE_MODEL, input="hi", max_output_tokens=2,
                                          include=["message.output_text.logprobs"],
                                          extra_body={"top_logprobs": 2}),
             "include", "logprobs")


def test_anthropic_structured_output_is_refused_not_ignored(served):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0, timeout=30.0)
    fmt = {"type": "json_schema", "schema": {"type": "object"}}
    for field in ("output_config", "output_format"):
        body = {"format": fmt} if field == "output_config" else fmt
        with pytest.raises(anthropic.BadRequestError, match="structured outputs") as e:
            client.messages.create(model=SERVE_MODEL, max_tokens=2, messages=MESSAGES,
                                   extra_body={field: body})
        assert e.value.body["error"]["type"] == "invalid_request_error"
    # output_config without a format (its effort, say) changes nothing here: accepted.
    msg = client.messages.create(model=SERVE_MODEL, max_tokens=2, messages=MESSAGES,
                                 extra_body={"output_config": {"effort": "low"}})
    assert msg.usage.output_tokens == 2
    client.close()


@pytest.mark.parametrize(("field", "value"), [
    ("structured_outputs", {"json": {"type": "object"}}),
    ("guided_json", {"type": "object"}),
    ("guided_choice", ["yes", "no"]),
    ("guided_regex", "[ab]+"),
    ("guided_grammar", "root ::= 'a'"),
])
def test_vllms_structured_output_fields_are_refused_not_ignored(sdk, field, value):
    """vLLM's own structured-output fields (beside response_format), sent through the SDK's
    extra_body as a vLLM user does: a 200 was unconstrained text the caller took as following
    the schema or the choice."""
    for call in (
        lambda: sdk.chat.completions.create(model=SERVE_MODEL, messages=MESSAGES, max_tokens=2,
                                            extra_body={field: value}),
        lambda: sdk.completions.create(model=SERVE_MODEL, prompt="hi", max_tokens=2,
                                       extra_body={field: value}),
    ):
        _refused(call, field, field)


def test_a_seed_outside_int64_is_refused_as_vllm_does(served, sdk):
    """vLLM takes a seed in int64's range (torch's long) and answers 400 outside it; serve kept
    63 bits of any integer, so 2**63 and 2**70 were one seed and gave the same text."""
    for seed in (2**63, -(2**63) - 1, 2**70):
        _refused(lambda s=seed: sdk.chat.completions.create(
            model=SERVE_MODEL, messages=MESSAGES, max_tokens=2, seed=s), "seed", "seed")
        _refused(lambda s=seed: sdk.responses.create(
            model=SERVE_MODEL, input="hi", max_output_tokens=2, extra_body={"seed": s}),
            "seed", "seed")
    ok = sdk.chat.completions.create(model=SERVE_MODEL, messages=MESSAGES, max_tokens=2,
                                     seed=2**63 - 1)
    assert ok.usage.completion_tokens == 2
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0, timeout=30.0)
    with pytest.raises(anthropic.BadRequestError, match="seed"):
        client.messages.create(model=SERVE_MODEL, max_tokens=2, messages=MESSAGES,
                               extra_body={"seed": 2**64})
    client.close()


def test_responses_logit_bias_is_refused_not_ignored(sdk):
    """vLLM's Responses request takes ``logit_bias`` and applies it; serve dropped it as an
    unknown field (200, the tokens unbiased) where chat answers it 400. An empty one is none."""
    _refused(lambda: sdk.responses.create(model=SERVE_MODEL, input="hi", max_output_tokens=2,
                                          extra_body={"logit_bias": {"1": 5.0}}),
             "logit_bias", "logit_bias")
    r = sdk.responses.create(model=SERVE_MODEL, input="hi", max_output_tokens=2,
                             extra_body={"logit_bias": {}})
    assert r.usage.output_tokens == 2
