"""Sessions as DAGs (issue 24): a turn fans out to sub-agents that run in parallel, and the
agent's next turn waits for them all (then its tool time). The per-session figures -- end to
end, time in tools, in the model, in sub-agents, TTFT by turn kind -- are computed here by hand
from the turns' own start and end times, in-process (exact: the simulator's virtual clock) and
over HTTP against `cbbench serve --engine sim` (the client's reads add a few ms per wait): one
server process for the module, `cbbench run` the console script's entry in this process
(helpers.cli_in_process), not a process that only added ~1 CPU-s of imports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SERVE_MODEL, cli_in_process, run_spec, serve_process

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.sessions import first_prompt_len
from cbbench.load.workload import load_workload
from cbbench.schema import to_dict

TOOLS = [{"type": "function", "function": {"name": "grep"}},
         {"type": "function", "function": {"name": "task"}}]
SEARCH_TOOL_MS, MAIN_TOOL_MS, SOLO_TOOL_MS = 25, 40, 30
# "dag": the main agent fans out to two sub-agents; "long" runs past "search" (whose tool wait
# it covers), and the main agent's tool turn waits for both, then its tool time.
DAG = {"session_id": "dag", "arrival_s": 0.0, "tools": TOOLS, "turns": [
    {"user_len": 30, "output_len": 4, "tool_choice": "required", "fan_out": ["search", "long"]},
    {"tool_result_len": 50, "tool_time_ms": MAIN_TOOL_MS, "output_len": 6}],
    "subagents": {
        "search": [{"user_len": 20, "output_len": 3, "tool_choice": "required"},
                   {"tool_result_len": 30, "tool_time_ms": SEARCH_TOOL_MS, "output_len": 3}],
        "long": [{"user_len": 10, "output_len": 300}]}}
# "chain": one sub-agent whose tool wait nothing covers; the main agent goes on at once.
CHAIN = {"session_id": "chain", "arrival_s": 0.1, "tools": TOOLS[:1], "turns": [
    {"user_len": 30, "output_len": 4, "fan_out": ["solo"]},
    {"user_len": 5, "output_len": 2, "think_time_ms": 0}],
    "subagents": {"solo": [
        {"user_len": 10, "output_len": 3, "tool_choice": "required"},
        {"tool_result_len": 10, "tool_time_ms": SOLO_TOOL_MS, "output_len": 3}]}}


def _write(tmp_path, sessions) -> str:
    path = tmp_path / "dag.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return str(path)


# ---- the format ------------------------------------------------------------------------------
def test_dag_parses_flat(tmp_path):
    (dag, chain) = load_workload(_write(tmp_path, [DAG, CHAIN])).sessions
    # flat order: the main agent's turns, then the sub-agents in the order fan-outs reach them
    assert [s.name for s in dag.subagents] == ["search", "long"]
    assert dag.num_turns == 5 and [dag.agent_name(k) for k in range(5)] == [
        None, None, "search", "search", "long"]
    assert dag.turns[0].fan_out == (1, 2)
    m1, m2, s1, s2, l1 = dag.nodes
    assert m1.children == (2, 4) and m2.waits_on == (0, 3, 4)  # the previous turn, both ends
    assert s1.waits_on == (0,) and s2.waits_on == (2,) and l1.waits_on == (0,)
    assert chain.nodes[1].waits_on == (0, 3)


BAD = [
    ({"fan_out": []}, "a fan-out without sub-agents"),
    ({"fan_out": ["ghost"]}, "unknown sub-agent 'ghost'"),
    ({"fan_out": ["search", "search"]}, "names a sub-agent twice"),
    ({"fan_out": "search"}, "'fan_out' must be a non-empty list"),
]


@pytest.mark.parametrize("change, message", BAD)
def test_bad_fan_out(tmp_path, change, message):
    bad = json.loads(json.dumps(DAG))
    bad["turns"][0].update(change)
    with pytest.raises(UsageError, match=message):
        load_workload(_write(tmp_path, [bad]))


def _dag_with(**subagents) -> dict:
    bad = json.loads(json.dumps(DAG))
    bad["subagents"].update(subagents)
    return bad


@pytest.mark.parametrize("session, message", [
    # x fans out to y and y to x: neither is reached from the main agent
    (_dag_with(x=[{"user_len": 1, "output_len": 1, "fan_out": ["y"]},
                  {"user_len": 1, "output_len": 1}],
               y=[{"user_len": 1, "output_len": 1, "fan_out": ["x"]},
                  {"user_len": 1, "output_len": 1}]), "cycle: (x -> y -> x|y -> x -> y)"),
    (_dag_with(x=[{"user_len": 1, "output_len": 1, "fan_out": ["x"]},
                  {"user_len": 1, "output_len": 1}]), "cycle: x -> x"),
    (_dag_with(spare=[{"user_len": 1, "output_len": 1}]), "'spare' is never fanned out to"),
    (_dag_with(long=[{"user_len": 1, "output_len": 1, "fan_out": ["search"]},
                     {"user_len": 1, "output_len": 1}]), "'search' is fanned out to twice"),
    (_dag_with(long=[{"user_len": 1, "output_len": 1, "fan_out": ["x"]}],
               x=[{"user_len": 1, "output_len": 1}]), "a fan-out on the agent's last turn"),
    (_dag_with(long=[{"tool_result_len": 1, "output_len": 1}]), "a tool turn must follow"),
    ({**DAG, "subagents": []}, "'subagents' must be a non-empty object"),
    ({**DAG, "subagents": {"long": []}}, "its turns must be a non-empty list"),
])
def test_bad_dag(tmp_path, session, message):
    with pytest.raises(UsageError, match=message):
        load_workload(_write(tmp_path, [session]))


def test_bad_dag_is_one_line_exit_2(tmp_path):
    bad = json.loads(json.dumps(DAG))
    bad["turns"][0]["fan_out"] = ["ghost"]
    out = cli_in_process(["run", "--engine", "sim", "--workload", _write(tmp_path, [bad])])
    assert out.returncode == 2 and out.stderr.startswith("cbbench: error: ")
    assert len(out.stderr.strip().splitlines()) == 1 and "unknown sub-agent" in out.stderr


# ---- the figures, by hand --------------------------------------------------------------------
def _turns(result: dict) -> dict:
    """(session, agent or "main", turn) -> (start, end, ttft_s, request)."""
    out = {}
    for r in result["requests"]:
        start = r["intended_start_s"]
        out[(r["session_id"], r.get("agent", "main"), r["turn"])] = (
            start, start + r["e2el_ms"] / 1000, r["ttft_ms"] / 1000, r)
    return out


def _by_hand(t: dict, wait_slack: float) -> dict:
    """Each session's figures from its turns' starts and ends, by the DAG's definition; checks
    on the way that every turn started when its DAG says (within ``wait_slack``: the client
    starts a wait just after it read the ends it waited for)."""
    def waited(start, after, wait):
        assert after + wait <= start + 1e-9 <= after + wait + wait_slack + 1e-9, (start, after)

    def length(*turns):
        return sum(t[x][1] - t[x][0] for x in turns)

    m1, m2 = ("dag", "main", 1), ("dag", "main", 2)
    s1, s2, l1 = ("dag", "search", 1), ("dag", "search", 2), ("dag", "long", 1)
    waited(t[s1][0], t[m1][1], 0)  # the sub-agents start when the fanning reply ended
    waited(t[l1][0], t[m1][1], 0)
    waited(t[s2][0], t[s1][1], SEARCH_TOOL_MS / 1000)
    assert t[l1][1] > t[s2][1]  # "long" outlasts "search", covering its tool wait
    waited(t[m2][0], t[l1][1], MAIN_TOOL_MS / 1000)  # both ended, then the tool time
    dag = {"duration": t[m2][1] - t[m1][0], "tools": t[m2][0] - t[l1][1],
           "model": length(m1, l1, m2), "subagents": length(l1)}
    c1, c2, o1, o2 = (("chain", "main", 1), ("chain", "main", 2), ("chain", "solo", 1),
                      ("chain", "solo", 2))
    waited(t[o1][0], t[c1][1], 0)
    waited(t[o2][0], t[o1][1], SOLO_TOOL_MS / 1000)
    waited(t[c2][0], t[o2][1], 0)
    chain = {"duration": t[c2][1] - t[c1][0], "tools": t[o2][0] - t[o1][1],
             "model": length(c1, o1, o2, c2), "subagents": length(o1, o2)}
    return {"dag": dag, "chain": chain}


def _check(result: dict, wait_slack: float) -> None:
    t = _turns(result)
    hand = _by_hand(t, wait_slack)
    s = result["summary"]["sessions"]
    assert s["completed"] == 2 and s["turns_sent"] == s["turns_planned"] == 9
    for ours, key in [("duration_s", "duration"), ("time_in_tools_s", "tools"),
                      ("time_in_model_s", "model"), ("time_in_subagents_s", "subagents")]:
        both = [hand["dag"][key], hand["chain"][key]]  # two values: their mean and spread
        assert s[ours]["mean"] == pytest.approx(np.mean(both), abs=1e-6), ours
        assert s[ours]["std"] == pytest.approx(np.std(both), abs=1e-6), ours
    # End to end = model + tools + the rest (no think time here but the client's read lag).
    for h in hand.values():
        assert h["duration"] - h["model"] - h["tools"] == pytest.approx(0, abs=3 * wait_slack + 1e-9)
    kinds = s["ttft_by_turn_kind_ms"]
    by_kind: dict[str, list[float]] = {}
    for (_, agent, _), (_, _, ttft, r) in t.items():
        by_kind.setdefault("subagent" if agent != "main" else r["turn_kind"], []).append(ttft)
    assert {k: v["count"] for k, v in kinds.items()} == {"user": 3, "tool": 1, "subagent": 5}
    for k, v in by_kind.items():
        assert kinds[k]["mean"] == pytest.approx(np.mean(v) * 1000, abs=1e-6)


def test_dag_in_process_by_hand(tmp_path):
    spec = run_spec(workload=_write(tmp_path, [DAG, CHAIN]), num_requests=None,
                   engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b"))
    result = to_dict(execute_run(spec))  # the file's JSON, as the HTTP tests read it
    _check(result, wait_slack=0.0)  # the virtual clock: every wait exact
    t = _turns(result)
    assert t[("dag", "main", 2)][0] == pytest.approx(t[("dag", "long", 1)][1] + 0.040, abs=1e-12)
    # a sub-agent's first turn is a history of its own
    assert t[("dag", "search", 1)][3]["prompt_tokens"] == first_prompt_len(20)


@pytest.fixture(scope="module")
def sim_serve():
    """conftest's sim_serve_process, once for the module's two HTTP cases."""
    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200") as run:
        yield run


@pytest.mark.parametrize("workers", [1, 2])
def test_dag_over_http_by_hand(tmp_path, sim_serve, workers):
    out = tmp_path / "http.json"
    run = cli_in_process(
        ["run", "--endpoint", sim_serve.url, "--api", "chat", "--workload",
         _write(tmp_path, [DAG, CHAIN]), "--workers", str(workers), "--output", str(out)])
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    _check(result, wait_slack=0.05)
    t = _turns(result)
    # The server saw the sub-agent's fresh history (shorter than the parent's first prompt),
    # and the main agent's tool turn carry its own call, not the sub-agents'.
    assert (t[("dag", "search", 1)][3]["server_prompt_tokens"]
            < t[("dag", "main", 1)][3]["server_prompt_tokens"])
    assert t[("dag", "main", 1)][3]["finish_reason"] == "tool_calls"


def test_a_failed_sub_agent_turn_stops_its_parent_not_its_sibling(tmp_path):
    """A sub-agent turn the engine rejects (beyond Llama-3-8B's 8,192-token context): that
    sub-agent stops, the main agent's next turn (which waits on it) is never sent, the other
    sub-agent runs to its end, and the session counts once as ended early."""
    bad = json.loads(json.dumps(DAG))
    bad["subagents"]["search"][0]["output_len"] = 9000
    spec = run_spec(workload=_write(tmp_path, [bad]), num_requests=None,
                   engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b"))
    result = execute_run(spec)
    s = result.summary.sessions
    assert s.ended_early == 1 and s.completed == 0
    sent = {((r.model_extra or {}).get("agent", "main"), r.turn): r for r in result.requests}
    assert sent[("search", 1)].error_type == "rejected"
    assert ("search", 2) not in sent and ("main", 2) not in sent  # never sent
    assert sent[("long", 1)].error is None and sent[("long", 1)].output_tokens == 300
    assert s.turns_sent == 3 and s.turns_planned == 5


# ---- issue 37, rule 6: sub-agents are requests like any other ---------------------------------
def test_two_sub_agents_with_equal_turns_finish_together_in_process(tmp_path):
    """The attack: two sub-agents with identical turns finish in the same engine step; the
    parent's next turn was pushed once per sub-agent (the same request id twice), and the
    feed's heap compared two Requests: a TypeError in targets/engine_feed.py."""
    twin = [{"user_len": 10, "output_len": 3}]
    session = {"session_id": "twins", "arrival_s": 0.0, "turns": [
        {"user_len": 30, "output_len": 4, "fan_out": ["a", "b"]},
        {"user_len": 5, "output_len": 2}], "subagents": {"a": twin, "b": twin}}
    spec = run_spec(workload=_write(tmp_path, [session]), num_requests=None,
                   engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b"))
    result = execute_run(spec)
    s = result.summary.sessions
    assert s.completed == 1 and s.turns_sent == 4 == s.turns_planned
    ids = [r.id for r in result.requests]
    assert len(ids) == len(set(ids)) == 4


DEEP = 2000


def _deep_chain() -> dict:
    """A 2,000-deep chain of sub-agents: each fans out to the next."""
    last = [{"user_len": 2, "output_len": 1}]
    subs = {f"s{d}": [{"user_len": 2, "output_len": 1, "fan_out": [f"s{d + 1}"]}, *last]
            if d + 1 < DEEP else last for d in range(DEEP)}
    return {"session_id": "deep", "arrival_s": 0.0,
            "turns": [{"user_len": 2, "output_len": 1, "fan_out": ["s0"]}, *last],
            "subagents": subs}


def test_a_2000_deep_sub_agent_chain_runs(tmp_path):
    """The attack: a RecursionError (the fan-outs walked depth first by recursion), in-process
    and over HTTP (the same parser). Every turn of the chain is sent, in order."""
    spec = run_spec(workload=_write(tmp_path, [_deep_chain()]), num_requests=None,
                   engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b"))
    result = execute_run(spec)
    s = result.summary.sessions
    assert s.turns_sent == 2 * DEEP + 1 == s.turns_planned and s.completed == 1
