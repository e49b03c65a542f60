"""request_body's bytes are json.dumps's of the whole body dict, whichever path made them
(the run's payload encoded once and the request's fields after it, or the dict encoded
whole): the request a server sees and `request_bytes` do not depend on the shortcut."""

from __future__ import annotations

import json

import pytest

from cbbench.targets.apis.api_specs import SPECS
from cbbench.targets.request import RequestContext, request_body

PROMPTS = ["know", "é ü \u2028 \x00 \" \\ \n\t", "".join(map(chr, range(0, 0x3000, 7))), "",
           [1, 2, 3]]
PAYLOADS = [SPECS["completions"].payload("m"), SPECS["chat"].payload("m"), {},
            {"model": "m", "max_tokens": 5}, {"prompt": "x", "messages": []},
            {"temperature": 1e-05, "top_p": 0.5, "stop": ["\n"]}]


def _whole(payload: dict, chat: bool, prompt, max_tokens, extra) -> bytes:
    body = dict(payload)
    body.update(extra or {})
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body["max_tokens"] = max_tokens
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("chat", [False, True])
def test_request_body_is_the_whole_dict_encoded(payload: dict, chat: bool) -> None:
    ctx = RequestContext(session=None, url=None, t0=0.0, timeout_s=1.0,  # type: ignore[arg-type]
                         payload=payload, chat=chat)
    for prompt in PROMPTS:
        for extra in (None, {"tools": [{"type": "function"}]}):
            for max_tokens in (0, 16, True):
                got = request_body(ctx, prompt, max_tokens, extra)
                assert got == _whole(payload, chat, prompt, max_tokens, extra)
                json.loads(got)
