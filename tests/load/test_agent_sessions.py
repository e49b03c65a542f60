"""Agent sessions (issue 24): tools offered, a turn that asks for a call, the tool turn that
answers it after the tool's latency, and the per-session split of time in tools vs in the
model -- by hand, in-process, and over HTTP against `cbbench serve` (also --workers 2).

`cbbench serve` is a real process, one for the module (each case reads its own requests from
its request log by their server ids); `cbbench run` is the console script's entry in this
process (helpers.cli_in_process): the client is the point, not ~1 CPU-s of start-up imports."""

from __future__ import annotations

import json

import pytest
from helpers import cli_in_process, serve_process, wait_until

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.turns import session_summary

TOOLS = [{"type": "function", "function": {"name": "grep"}}]
TOOL_MS = (300, 150)
LOG_WAIT_S = 10.0  # the server's log thread writes a request's line just after its reply


def agent_session(name: str, arrival: float) -> dict:
    return {"session_id": name, "arrival_s": arrival, "tools": TOOLS, "turns": [
        {"user_len": 20, "output_len": 6, "tool_choice": "required"},
        {"tool_result_len": 40, "tool_time_ms": TOOL_MS[0], "output_len": 5,
         "tool_choice": "required"},
        {"tool_result_len": 30, "tool_time_ms": TOOL_MS[1], "output_len": 8},
        {"user_len": 10, "output_len": 4, "think_time_ms": 100},
    ]}


def rec(turn, kind, start, times) -> RequestRecord:
    return RequestRecord(id=turn, prompt_tokens=10, output_tokens=len(times),
                         intended_start_s=start, send_s=start, token_times_s=times,
                         session_id="a", turn=turn, turn_kind=kind)


def test_session_summary_by_hand():
    # turn 1 (user) 0.0 -> 0.5; tool 0.3 s; turn 2 (tool) 0.8 -> 1.0; think 0.2; turn 3 (user)
    # 1.2 -> 1.5. End to end 1.5 s: model 0.5 + 0.2 + 0.3 = 1.0, tools 0.3, think 0.2.
    recs = [rec(1, "user", 0.0, [0.1, 0.5]), rec(2, "tool", 0.8, [0.85, 1.0]),
            rec(3, "user", 1.2, [1.4, 1.5])]
    s = session_summary(recs, {"a": 3}, 0)
    assert s["completed"] == 1
    assert s["duration_s"]["mean"] == pytest.approx(1.5)
    assert s["time_in_tools_s"]["mean"] == pytest.approx(0.3)
    assert s["time_in_model_s"]["mean"] == pytest.approx(1.0)
    assert s["ttft_by_turn_kind_ms"]["user"]["mean"] == pytest.approx(150.0)  # 100, 200
    assert s["ttft_by_turn_kind_ms"]["tool"]["mean"] == pytest.approx(50.0)


def _run(tmp_path, name, *target) -> dict:
    wl = tmp_path / "agent.jsonl"
    wl.write_text("".join(json.dumps(agent_session(f"s{i}", 0.2 * i)) + "\n" for i in range(3)))
    out = cli_in_process(["run", *target, "--workload", str(wl), "--output",
                          str(tmp_path / f"{name}.json")])
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads((tmp_path / f"{name}.json").read_text())


def _check(result: dict, exact: bool) -> None:
    s = result["summary"]["sessions"]
    assert s["completed"] == 3
    tools = sum(TOOL_MS) / 1000
    if exact:  # in-process: the tool turn arrives exactly the tool's latency after the reply
        assert s["time_in_tools_s"]["mean"] == pytest.approx(tools, abs=1e-9)
    else:  # over HTTP, the client starts the wait just after it read the reply's end
        assert tools <= s["time_in_tools_s"]["mean"] <= tools + 0.05
    assert set(s["ttft_by_turn_kind_ms"]) == {"user", "tool"}
    assert s["ttft_by_turn_kind_ms"]["tool"]["count"] == 6
    # end to end = tools + model + the one think time (turn 4 waits 100 ms)
    split = s["time_in_tools_s"]["mean"] + s["time_in_model_s"]["mean"] + 0.1
    assert s["duration_s"]["mean"] == pytest.approx(split, abs=0.05)


def test_agent_sessions_in_process(tmp_path):
    _check(_run(tmp_path, "engine", "--engine", "sim"), exact=True)


def _log_lines(log, ids: set) -> dict:
    """The served requests' lines of the shared server's log, by id, once all of ``ids`` are
    written (the server stays up, so the last lines may still be on their way)."""
    lines: dict = {}

    def written() -> bool:
        text = log.read_text()
        whole = text[: text.rfind("\n") + 1]  # a line being written is not read yet
        lines.update((x["id"], x) for x in map(json.loads, whole.splitlines()))
        return ids <= lines.keys()

    wait_until(written, LOG_WAIT_S, "the request log's lines of the run")
    return lines


@pytest.fixture(scope="module")
def logged_serve(tmp_path_factory):
    """`cbbench serve --engine sim --request-log LOG`, shared by the HTTP cases."""
    log = tmp_path_factory.mktemp("agent_serve") / "serve.jsonl"
    with serve_process("--engine", "sim", "--request-log", str(log)) as srv:
        yield srv, log


@pytest.mark.parametrize("api,workers", [("chat", 1), ("chat", 2), ("responses", 1),
                                         ("anthropic", 1)])
def test_agent_sessions_over_http(tmp_path, logged_serve, api, workers):
    """Also over the Responses API (function_call / function_call_output items) and Anthropic's
    (tool_use / tool_result blocks)."""
    srv, log = logged_serve
    result = _run(tmp_path, "http", "--endpoint", srv.url, "--api", api,
                  "--workers", str(workers))
    _check(result, exact=False)
    reqs = sorted(result["requests"], key=lambda r: (r["session_id"], r["turn"]))
    for r in reqs:
        asked = r["turn"] in (1, 2)
        assert (r["finish_reason"] == "tool_calls") == asked
        if asked:
            (call,) = r["tool_calls"]
            assert call["name"] == "grep" and call["argument_tokens"] == r["output_tokens"]
    # The server saw each tool turn's prompt carry the call and the tool's result: longer
    # than the turn before by its reply (the call) and the result's tokens.
    lines = _log_lines(log, {r["server_request_id"] for r in reqs})
    for a, b in zip(reqs, reqs[1:]):
        if a["session_id"] == b["session_id"] and b["turn"] in (2, 3):
            pa = lines[a["server_request_id"]]["prompt_tokens"]
            pb = lines[b["server_request_id"]]["prompt_tokens"]
            assert pb - pa >= 30 + 1  # the result (>= 30 words) and the call's arguments


def test_a_tool_turn_without_tools_is_one_line(tmp_path):
    bad = agent_session("x", 0.0)
    del bad["tools"]
    wl = tmp_path / "bad.jsonl"
    wl.write_text(json.dumps(bad) + "\n")
    out = cli_in_process(["run", "--engine", "sim", "--workload", str(wl)])
    assert out.returncode == 2 and out.stderr.startswith("cbbench: error: ")
    assert "'tool_choice' without 'tools'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    bad = {"tools": TOOLS, "turns": [{"user_len": 5, "output_len": 3},
                                     {"tool_result_len": 4, "output_len": 2}]}
    wl.write_text(json.dumps(bad) + "\n")
    out = cli_in_process(["run", "--engine", "sim", "--workload", str(wl)])
    assert out.returncode == 2 and "must follow a turn whose 'tool_choice'" in out.stderr
