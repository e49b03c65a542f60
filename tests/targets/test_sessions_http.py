"""Multi-turn sessions over HTTP (--api chat): the history goes out as `messages` with the
assistant's replies as the server sent them; sharegpt-multiturn against `cbbench serve` over
chat completes with 0 errors; a failed turn ends its session."""

from __future__ import annotations

import json

import pytest
from helpers import invoke_app, run_spec, sim_options, start_server

from cbbench.bench.runner import RunSpec, execute_run
from cbbench.cli.serve import build_serving_engine
from cbbench.schema import read_run, to_dict
from cbbench.targets.options import EndpointOptions

KV_BLOCKS = 4096  # 65k tokens: room for several whole conversations at once


@pytest.fixture(scope="module")
def srv():
    run = start_server(lambda: build_serving_engine(sim_options(num_kv_blocks=KV_BLOCKS)))
    yield run
    run.stop()


def _spec(url: str, workload: str, api: str = "chat", **kw) -> RunSpec:
    return run_spec(
        workload=workload,
        endpoint=EndpointOptions(endpoint=url, api=api, request_timeout_s=60.0),
        think_time="0",
        **kw,
    )


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_sharegpt_multiturn_against_serve_over_chat(srv, api):
    """Over chat, and over the Responses and Anthropic APIs with the whole history as their
    input: the same prompt growth, turn by turn."""
    result = execute_run(
        _spec(srv.url, "sharegpt-multiturn", api=api, num_requests=5, request_rate=20.0),
    )
    s = result.summary
    assert s.failed == 0 and s.error_types == {}
    assert s.completed == s.sessions.turns_planned == s.sessions.turns_sent
    assert s.sessions.completed == s.sessions.count == 5
    assert [t.turn for t in s.by_turn] == list(range(1, len(s.by_turn) + 1))
    assert s.by_turn[0].completed == 5
    # The server saw each turn's whole history: its prompt grew by the previous reply and the
    # new message, plus the same template overhead every turn.
    by_session: dict = {}
    for r in result.requests:
        by_session.setdefault(r.session_id, []).append(r)
    overheads = set()
    for recs in by_session.values():
        recs.sort(key=lambda r: r.turn)
        for prev, nxt in zip(recs, recs[1:]):
            user_len = nxt.prompt_tokens - prev.prompt_tokens - prev.output_tokens
            grew = nxt.server_prompt_tokens - prev.server_prompt_tokens
            overheads.add(grew - prev.output_tokens - user_len)
    assert len(overheads) == 1, overheads


def test_history_is_sent_as_messages_with_the_replies(fake_server, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"session_id": "bob", "turns": [
        {"user": "first question", "output_len": 3},
        {"user": "second question", "output_len": 2},
        {"user": "third", "output_len": 1},
    ]}) + "\n")
    fake_server.reset()
    result = execute_run(_spec(fake_server.url, str(path), num_requests=None))
    assert result.summary.completed == 3
    bodies = [r["body"] for r in fake_server.requests if r["path"] == "/v1/chat/completions"]
    assert [b["messages"] for b in bodies] == [
        [{"role": "user", "content": "first question"}],
        [{"role": "user", "content": "first question"},
         {"role": "assistant", "content": " a a a"},
         {"role": "user", "content": "second question"}],
        [{"role": "user", "content": "first question"},
         {"role": "assistant", "content": " a a a"},
         {"role": "user", "content": "second question"},
         {"role": "assistant", "content": " a a"},
         {"role": "user", "content": "third"}],
    ]
    assert [b["max_tokens"] for b in bodies] == [3, 2, 1]
    # Each turn is sent only after the previous reply finished.
    times = [r["t"] for r in fake_server.requests if r["path"] == "/v1/chat/completions"]
    assert times == sorted(times)
    reqs = sorted(result.requests, key=lambda r: r.turn)
    assert [(r.session_id, r.turn) for r in reqs] == [("bob", 1), ("bob", 2), ("bob", 3)]


def test_a_failed_turn_ends_its_session(fake_server, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(
        json.dumps({"turns": [{"user": "fault:http500", "output_len": 2},
                              {"user": "never sent", "output_len": 2},
                              {"user": "nor this", "output_len": 2}]}) + "\n"
        + json.dumps({"turns": [{"user": "fine", "output_len": 2},
                                {"user": "still fine", "output_len": 2}]}) + "\n"
    )
    result = execute_run(_spec(fake_server.url, str(path), num_requests=None))
    s = result.summary
    assert (s.completed, s.failed, s.not_sent) == (2, 1, 2)
    assert s.sessions.ended_early == 1 and s.sessions.completed == 1


def test_sessions_need_the_chat_api(fake_server, tmp_path):
    res = invoke_app([
        "run", "--workload", "sharegpt-multiturn", "--endpoint", fake_server.url, "--api",
        "completions", "--num-requests", "2", "--output", str(tmp_path / "r.json"),
    ])
    assert res.exit_code == 2
    assert res.output.strip() == (
        "cbbench: error: multi-turn sessions send the history as messages: use --api chat, "
        "responses or anthropic"
    )


def test_cli_run_over_chat_writes_turns(srv, tmp_path):
    out = tmp_path / "r.json"
    res = invoke_app([
        "run", "--workload", "sharegpt-multiturn", "--endpoint", srv.url, "--api", "chat",
        "--num-requests", "3", "--think-time", "exp:5", "--request-rate", "10",
        "--output", str(out),
    ])
    assert res.exit_code == 0, res.output
    assert "turn" in res.output and "sessions: 3 of 3 completed" in res.output
    result = to_dict(read_run(out))
    assert result["config"]["sessions"]["think_time"] == "exp:5"
    assert all(r["turn"] >= 1 and r["session_id"] is not None for r in result["requests"])

