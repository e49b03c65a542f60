"""The built-in ``agentic-coding`` workload (workloads/build_agentic_coding.py): the committed
data is what the builder makes, its meta file names the source and says what is assumed, and
it runs in-process and over HTTP (--workers 2 over HTTP: tests/targets/test_audit_agentic.py,
which also audits it against the server's log). `cbbench run` is the console script's entry in
this process (helpers.cli_in_process): a process around it only added ~1 CPU-s of imports."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers import cli_in_process, run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.load.sessions import prompt_lens, sample_sessions
from cbbench.load.workload import load_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
MAX_BYTES = 1_000_000
LLAMA3_8B_CONTEXT = 8192
# 4 sessions drawn with this seed hold one that fans out to sub-agents (checked below).
SEED, NUM_SESSIONS = 29, 4


def _builder():
    spec = importlib.util.spec_from_file_location("build_agentic_coding",
                                                  WORKLOADS / "build_agentic_coding.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_committed_data_is_what_the_builder_makes(tmp_path):
    _builder().build(tmp_path)
    for name in ("agentic_coding.jsonl", "agentic_coding.meta.json"):
        assert (tmp_path / name).read_bytes() == (WORKLOADS / name).read_bytes(), name
    assert (WORKLOADS / "agentic_coding.jsonl").stat().st_size < MAX_BYTES


def test_meta_cites_the_source_and_matches_the_data():
    meta = json.loads((WORKLOADS / "agentic_coding.meta.json").read_text())
    src = meta["source"]
    assert src["paper"].startswith("https://arxiv.org/") and src["data_and_code"].startswith(
        "https://github.com/")
    assert src["figures"]["tool_steps_per_request"]["p50"] == 1
    assert "fan_out" in meta["assumed"] and "first_message_len" in meta["assumed"]
    w = load_workload("agentic-coding")
    assert len(w.sessions) == meta["sessions"]
    assert sum(s.num_turns for s in w.sessions) == meta["turns"]
    assert sum(bool(s.subagents) for s in w.sessions) == meta["sessions_with_subagents"] > 0
    # Every agent's history fits Llama-3-8B's context (the assumption that caps the steps).
    for s in w.sessions:
        assert max(p + t.output_len for p, t in zip(prompt_lens(s), s.all_turns)) \
            <= LLAMA3_8B_CONTEXT
    # the published medians, as drawn
    st = meta["stats"]
    assert 150 <= st["output_len"]["p50"] <= 300 and 150 <= st["tool_result_len"]["p50"] <= 350
    assert 150 <= st["tool_time_ms"]["p50"] <= 500


def test_the_test_draw_holds_a_fan_out():
    drawn, _ = sample_sessions(load_workload("agentic-coding").sessions, NUM_SESSIONS, SEED)
    assert any(s.subagents for s in drawn)


def test_agentic_coding_in_process():
    result = execute_run(run_spec(workload="agentic-coding", num_requests=NUM_SESSIONS, seed=SEED,
                                 engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b")))
    s = result.summary.sessions
    drawn, _ = sample_sessions(load_workload("agentic-coding").sessions, NUM_SESSIONS, SEED)
    assert s.completed == NUM_SESSIONS and s.turns_sent == sum(d.num_turns for d in drawn)
    assert set(s.ttft_by_turn_kind_ms) == {"user", "tool", "subagent"}
    assert s.ttft_by_turn_kind_ms["subagent"]["count"] == sum(
        sum(len(a.turns) for a in d.subagents) for d in drawn)
    assert s.time_in_subagents_s.p99 > 0  # the session that fanned out
    # The tools' latencies as drawn: a session's time in tools is at most its tool turns'
    # summed waits (a wait another agent's model time covers is not counted).
    most = max(sum(t.think_time_s for t in d.all_turns if t.kind == "tool") for d in drawn)
    assert 0 < s.time_in_tools_s.p99 <= most + 1e-9


def test_agentic_coding_over_http(tmp_path, sim_serve_process):
    out = tmp_path / "http.json"
    run = cli_in_process(
        ["run", "--endpoint", sim_serve_process.url, "--api", "chat", "--workload",
         "agentic-coding", "--num-requests", str(NUM_SESSIONS), "--seed", str(SEED),
         "--tool-time-scale", "0.001", "--output", str(out)])
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    s = result["summary"]["sessions"]
    assert s["completed"] == NUM_SESSIONS and s["turns_sent"] == s["turns_planned"]
    assert set(s["ttft_by_turn_kind_ms"]) == {"user", "tool", "subagent"}
    assert result["config"]["sessions"]["tool_time_scale"] == 0.001
    # every tool-calling turn got its call from the server
    asked = [r for r in result["requests"] if r["finish_reason"] == "tool_calls"]
    assert asked and all(r["tool_calls"] for r in asked)


@pytest.mark.parametrize("scale", ["-1", "nan", "5000"])
def test_bad_tool_time_scale_is_one_line(scale):
    out = cli_in_process(["run", "--engine", "sim", "--workload", "agentic-coding",
                          "--num-requests", "2", "--tool-time-scale", scale])
    assert out.returncode == 2 and out.stderr.startswith("cbbench: error: ")
    assert "--tool-time-scale" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_tool_time_scale_needs_sessions():
    out = cli_in_process(["run", "--engine", "sim", "--workload", "sharegpt",
                          "--num-requests", "2", "--tool-time-scale", "0.5"])
    assert out.returncode == 2 and "applies to agent session workloads" in out.stderr
