"""`cbbench serve`'s reasoning, tool-call, multi-token and cached-token output (issue 24), as a
client reads it off the wire."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from helpers import cli_in_process, sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig

TOOLS = [{"type": "function", "function": {"name": "grep"}},
         {"type": "function", "function": {"name": "ls"}}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    log = tmp_path_factory.mktemp("kinds") / "log.jsonl"
    cfg = ServeConfig(request_log=str(log), stream_interval=2, reasoning_field="reasoning",
                      report_cached_tokens=True)
    run = start_server(lambda: build_serving_engine(sim_options(enable_prefix_caching=True)),
                       cfg)
    yield run, log
    run.stop()


def post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def events(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: {")]


def test_reasoning_then_tool_call_in_two_token_events(srv):
    run, log = srv
    body = {"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 7,
            "stream": True, "reasoning_tokens": 4, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "ls"}},
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, raw = post(run.url, body)
    assert status == 200
    evs = events(raw)
    role, *tokens, tail = evs
    assert role["choices"][0]["delta"]["role"] == "assistant"
    deltas = [e["choices"][0]["delta"] for e in tokens]
    # 7 tokens, the first at once, then 2 per event (vLLM's --stream-interval):
    # [r] [r r] [r t] [t t]; reasoning in delta.reasoning
    assert [e["usage"]["completion_tokens"] for e in tokens] == [1, 3, 5, 7]
    assert set(deltas[0]) == set(deltas[1]) == {"reasoning"}
    assert set(deltas[2]) == {"reasoning", "tool_calls"}
    first_call = deltas[2]["tool_calls"][0]
    assert first_call["function"]["name"] == "ls" and first_call["id"].startswith("call_")
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[2:])
    assert json.loads(args) == {"input": " tok tok tok"}  # 3 tool tokens' text
    assert tokens[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert tail["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}
    assert tail["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    run.app.state.request_log.close()  # flushes the line
    line = json.loads(log.read_text().splitlines()[-1])
    assert [e[1:] for e in line["events"]] == [
        [1, "reasoning"], [2, "reasoning"], [2, "reasoning+tool"], [2, "tool"]]
    assert (line["reasoning_tokens"], line["tool_call_tokens"], line["output_tokens"]) == (4, 3, 7)
    assert line["first_output_sent"] == line["events"][2][0]
    assert line["finish"] == "tool_calls"


def test_non_streamed_reasoning_and_tool_call(srv):
    run, _ = srv
    status, raw = post(run.url, {"messages": [{"role": "user", "content": "x"}],
                                 "max_tokens": 5, "reasoning_tokens": 2, "tools": TOOLS})
    assert status == 200
    body = json.loads(raw)
    msg = body["choices"][0]["message"]
    assert msg["reasoning"] == " tok tok" and msg["content"] is None
    (call,) = msg["tool_calls"]
    assert call["function"]["name"] == "grep"  # the first tool under "auto"
    assert json.loads(call["function"]["arguments"]) == {"input": " tok tok tok"}
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_cached_tokens_from_the_prefix_cache(srv):
    run, _ = srv
    prompt = " ".join(str(i) for i in range(100))  # decimal words are their own ids
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    first = json.loads(post(run.url, body)[1])["usage"]["prompt_tokens_details"]
    again = json.loads(post(run.url, body)[1])["usage"]["prompt_tokens_details"]
    assert first["cached_tokens"] == 0
    assert again["cached_tokens"] >= 64  # whole 16-token blocks of the same prompt


@pytest.mark.parametrize("body,message", [
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}},
     "not in tools"),
    ({"reasoning_tokens": -1}, "reasoning_tokens"),
])
def test_bad_tool_and_reasoning_fields_are_400(srv, body, message):
    run, _ = srv
    status, raw = post(run.url, {"messages": [{"role": "user", "content": "x"}], **body})
    assert status == 400 and message in json.loads(raw)["error"]["message"]


@pytest.mark.parametrize("args,message", [
    (["--stream-interval", "0"], "--stream-interval must be in [1, 65536]"),
    (["--reasoning-field", "thoughts"], "--reasoning-field must be one of"),
])
def test_bad_serve_options_are_one_line(args, message):
    """The console script's entry in this process (helpers.cli_in_process): the refusal comes
    before anything is served, so a process around it only added its start-up imports."""
    out = cli_in_process(["serve", "--engine", "sim", *args])
    assert out.returncode == 2 and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("chat", [True, False])
def test_usage_template_writes_json_dumps_bytes(chat):
    """The hot path's byte template with the running usage is the dict path's bytes."""
    from cbbench.server.chunks import Shape, sse_bytes
    from cbbench.server.protocol import usage

    shape = Shape(chat, "m")
    chunk = shape.chunk(' t"\u00e9', None)
    chunk["usage"] = usage(4, 7)
    assert shape.token_event_usage(' t"\u00e9', 4, 7) == sse_bytes(chunk)
