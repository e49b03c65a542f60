"""vLLM's repetition_penalty, presence_penalty, frequency_penalty and min_p on `cbbench serve`
(seventh review): the engine's sampler applies temperature, top_k and top_p only
(engine/torch/sampler.py), so any other value of these was a 200 whose output ignored it. Now
a value that would change the tokens is a 400 naming the field, as logit_bias is (protocol.py's
promise), on completions, chat and the Responses API; out of vLLM's ranges, in vLLM's words
(SamplingParams._verify_args); the neutral values, or null, are still accepted."""

from __future__ import annotations

import httpx
import pytest
from helpers import sim_options, start_server

from cbbench.cli.serve import build_serving_engine

PATHS = {
    "/v1/completions": {"prompt": "a b c", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "a b c"}],
                             "max_tokens": 2},
    "/v1/responses": {"input": "a b c", "max_output_tokens": 2},
}
NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0, "min_p": 0}


@pytest.fixture(scope="module")
def client():
    run = start_server(lambda: build_serving_engine(sim_options()))
    with httpx.Client(base_url=run.url, timeout=30.0) as c:
        yield c
    run.stop()


def _error(client, path: str, fields: dict) -> dict:
    r = client.post(path, json={**PATHS[path], **fields})
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(("field", "value"), [
    ("repetition_penalty", 1.3), ("repetition_penalty", 0.5), ("presence_penalty", 0.5),
    ("presence_penalty", -1), ("frequency_penalty", 1.5), ("min_p", 0.1),
], ids=["rep-1.3", "rep-0.5", "presence-0.5", "presence-minus-1", "frequency-1.5", "min-p-0.1"])
def test_a_value_the_sampler_would_ignore_is_a_400_naming_it(client, path, field, value):
    err = _error(client, path, {field: value})
    assert err["param"] == field and err["type"] == "invalid_request_error"
    assert err["message"].startswith(f"{field} is not supported"), err
    assert "temperature, top_k and top_p" in err["message"]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(("field", "value", "message"), [
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5."),
    ("frequency_penalty", -3, "frequency_penalty must be in [-2, 2], got -3.0."),
    ("repetition_penalty", 0, "repetition_penalty must be greater than zero, got 0.0."),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5."),
], ids=["presence", "frequency", "repetition", "min-p"])
def test_out_of_vllms_range_in_vllms_words(client, path, field, value, message):
    err = _error(client, path, {field: value})
    assert err["param"] == field and err["message"] == message


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("fields", [NEUTRAL, dict.fromkeys(NEUTRAL)], ids=["neutral", "nulls"])
def test_neutral_values_are_accepted(client, path, fields):
    r = client.post(path, json={**PATHS[path], **fields})
    assert r.status_code == 200, r.text

