"""Build the built-in ``agentic-coding`` workload: coding-agent sessions (a task, then a loop of
tool calls and tool results, some fanning out to sub-agents), drawn from published statistics
of real Claude Code and Codex sessions.

Source
------
TraceLab (Zhu et al., "TraceLab: Characterizing Coding Agent Workloads for LLM Serving",
arXiv 2606.30560; data and analysis code https://github.com/uw-syfi/TraceLab; figures at
https://tracelab.cs.washington.edu): 4,265 sessions, 357,161 agent steps, 432,510 tool calls.
The figures taken from it (``SOURCE`` below; the meta file repeats them with where each is):

- tool-initiated steps per request (one user input through the agent's final response):
  p25 0, p50 1, p90 20, p99 86, mean 7.8 (tab:session_internal_counts);
- output tokens per agent step: median 252 (Claude Code), 184 (Codex), right-skewed
  (fig:output_tokens);
- new context per step after the previous reply's replay is removed (the tool result and its
  framing): median 251 tokens (Claude Code; the adjusted_prefix_append analysis);
- per-call tool latency: p50 0.3 s, p90 13.6 s, p99 3.6 min, mean 18.4 s
  (tab:timing_distribution, "per individual latency");
- tool calls per step: mean 1.2, p50 1, p90 2 (parallel calls are the exception);
- Claude Code's ``Agent`` tool (its sub-agents) is a rare, slow, blocking call.

What is assumed (``ASSUMED`` below; not in the source): the distribution shapes between the
published quantiles (steps: linear between the quantiles; output and result lengths: lognormal
through the medians with an assumed spread; tool latency: lognormal through p50 and p90), one
tool call per step (the session format sends one), the first message's length (the source's
first prompts hold a 10k+ token system prompt; scaled down here so a session fits
Llama-3-8B's 8,192-token context, which also caps how many steps a session keeps), the share
of sessions that fan out to sub-agents and their size (the source gives no count), one user
request per session (its sessions have 9.2 on average, but p50 1, and between requests a
person's minutes-long wait), tool latency capped at 60 s.

Output: ``<out>/agentic_coding.jsonl`` (one session per line, the JSONL session format of
docs/streaming.md: ``tools``, ``turns``, ``subagents``/``fan_out``) and
``<out>/agentic_coding.meta.json`` (the source, each figure's origin, the assumptions, counts,
statistics of what was drawn).

How to rerun (no download: the figures are constants here)::

    python workloads/build_agentic_coding.py --out workloads/
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

SEED = 20260702
NUM_SESSIONS = 240
JSONL_NAME = "agentic_coding.jsonl"
META_NAME = "agentic_coding.meta.json"
TOOLS = ["read_file", "edit_file", "bash", "grep", "task"]  # "task" starts sub-agents
SOURCE = {
    "name": "TraceLab: Characterizing Coding Agent Workloads for LLM Serving (SyFI trace)",
    "paper": "https://arxiv.org/abs/2606.30560",
    "data_and_code": "https://github.com/uw-syfi/TraceLab",
    "site": "https://tracelab.cs.washington.edu",
    "trace": {"sessions": 4265, "agent_steps": 357161, "tool_calls": 432510,
              "agents": ["Claude Code", "Codex"]},
    "figures": {
        "tool_steps_per_request": {"p25": 0, "p50": 1, "p90": 20, "p99": 86, "mean": 7.8,
                                   "where": "tab:session_internal_counts (artifacts/session/"
                                            "session_internal_counts)"},
        "output_tokens_per_step_median": {"claude_code": 252, "codex": 184,
                                          "where": "fig:output_tokens (artifacts/"
                                                   "llm_generation/output_tokens)"},
        "new_context_per_step_median": {"claude_code": 251,
                                        "where": "artifacts/llm_generation/"
                                                 "adjusted_prefix_append (raw append median "
                                                 "835, of which the previous reply's replay "
                                                 "is the rest)"},
        "tool_latency_s": {"p50": 0.3, "p90": 13.6, "p99": 216.0, "mean": 18.4,
                           "where": "tab:timing_distribution, per individual latency"},
        "tool_calls_per_step": {"mean": 1.2, "p50": 1, "p90": 2,
                                "where": "tab:session_internal_counts"},
        "subagents": "Claude Code's Agent tool: a rare, slow, blocking call (artifacts/"
                     "tool_calls/tool_time_by_kind, tool_latency_distribution); no count given",
    },
}
STEP_QUANTILES = [(0.0, 0.0), (0.25, 0.0), (0.5, 1.0), (0.9, 20.0), (0.99, 86.0), (1.0, 120.0)]
OUTPUT_MEDIAN = (252 + 184) / 2
RESULT_MEDIAN = 251
TOOL_P50_S, TOOL_P90_S = 0.3, 13.6
Z90 = 1.2815515655446004  # the standard normal's 90th percentile
ASSUMED = {
    "steps_between_quantiles": "linear interpolation of the published quantiles (p100 120)",
    "output_len": {"lognormal_median": OUTPUT_MEDIAN, "sigma": 0.9, "min": 16, "max": 1024,
                   "why": "median: the two agents' medians averaged; spread assumed"},
    "tool_result_len": {"lognormal_median": RESULT_MEDIAN, "sigma": 1.1, "min": 8, "max": 2048},
    "tool_time_ms": {"lognormal_through": "p50 0.3 s, p90 13.6 s", "max_ms": 60000},
    "first_message_len": {"uniform": [1000, 3000], "why": "the source's 10k+ system prompts, "
                          "scaled down to fit an 8,192-token context"},
    "max_context_len": 7600,
    "tool_calls_per_step": 1,
    "requests_per_session": 1,
    "fan_out": {"share_of_sessions_with_2plus_steps": 0.15, "subagents": [2, 3],
                "subagent_task_len": [200, 600], "subagent_max_steps": 6,
                "join": "the fanning turn calls `task`; the next turn is its tool result, the "
                        "sub-agents' final replies together, with no tool time of its own"},
}
FAN_OUT_SHARE = 0.15
MAX_CONTEXT = 7600
# Llama-3's chat template per message (cbbench.load.sessions): header 4 + end 1; the first
# prompt adds BOS and the generation prompt (4).
MESSAGE_OVERHEAD = 5


def _lognormal(rng, median: float, sigma: float, low: int, high: int) -> int:
    return int(np.clip(round(median * math.exp(sigma * rng.standard_normal())), low, high))


def _steps(rng) -> int:
    q = rng.uniform()
    xs, ys = zip(*STEP_QUANTILES)
    return int(np.floor(np.interp(q, xs, ys) + 0.5))  # to the nearest: p50 stays 1


def _tool_ms(rng) -> int:
    sigma = math.log(TOOL_P90_S / TOOL_P50_S) / Z90
    return int(min(60000, round(1000 * TOOL_P50_S * math.exp(sigma * rng.standard_normal()))))


def _context(turns: list[dict]) -> int:
    """An agent's last prompt plus its reply, in Llama-3's template."""
    total = 1 + 4  # BOS; each message's header (4) and end (1) come with it below
    for t in turns:
        total += MESSAGE_OVERHEAD + t.get("user_len", t.get("tool_result_len", 0))
        total += 4 + t["output_len"] + 1
    return total


def _loop(rng, first_len: int, steps: int, max_steps: int | None = None) -> list[dict]:
    """An agent's turns: its task, then up to ``steps`` tool calls and results, ending with a
    reply that calls nothing; steps stop while the context still fits MAX_CONTEXT."""
    if max_steps is not None:
        steps = min(steps, max_steps)
    out = _lognormal(rng, OUTPUT_MEDIAN, 0.9, 16, 1024)
    turns: list[dict[str, int | str]] = [{"user_len": first_len, "output_len": out}]
    context = 1 + MESSAGE_OVERHEAD + first_len + 4 + out
    for _ in range(steps):
        result = _lognormal(rng, RESULT_MEDIAN, 1.1, 8, 2048)
        reply = _lognormal(rng, OUTPUT_MEDIAN, 0.9, 16, 1024)
        grown = context + 1 + MESSAGE_OVERHEAD + result + 4 + reply
        if grown > MAX_CONTEXT:
            break
        turns[-1]["tool_choice"] = "required"
        turns.append({"tool_result_len": result, "tool_time_ms": _tool_ms(rng),
                      "output_len": reply})
        context = grown
    return turns


def _session(rng, k: int) -> dict:
    turns = _loop(rng, int(rng.integers(1000, 3001)), _steps(rng))
    session: dict = {"session_id": f"agent-{k:03d}",
                     "tools": [{"type": "function", "function": {"name": n}} for n in TOOLS]}
    calls = [j for j, t in enumerate(turns) if t.get("tool_choice")]
    if len(calls) >= 2 and rng.uniform() < FAN_OUT_SHARE:
        j = int(rng.choice(calls))  # this call is `task`: its result is the sub-agents' work
        names = [f"sub{a + 1}" for a in range(int(rng.integers(2, 4)))]
        subs = {n: _loop(rng, int(rng.integers(200, 601)), _steps(rng), max_steps=6)
                for n in names}
        result = sum(s[-1]["output_len"] for s in subs.values())
        grown = _context(turns) + result - turns[j + 1]["tool_result_len"]
        if grown <= MAX_CONTEXT:  # else this session stays without sub-agents
            turns[j]["tool_choice"] = {"type": "function", "function": {"name": "task"}}
            turns[j]["fan_out"] = names
            turns[j + 1]["tool_result_len"] = result
            turns[j + 1]["tool_time_ms"] = 0
            session["subagents"] = subs
    session["turns"] = turns
    return session


def _stats(values) -> dict:
    a = np.asarray(values, dtype=float)
    return {"mean": round(float(a.mean()), 2), "p50": float(np.percentile(a, 50)),
            "p90": round(float(np.percentile(a, 90)), 1), "max": float(a.max())}


def build(out_dir: Path) -> dict:
    rng = np.random.default_rng(SEED)
    sessions = [_session(rng, k) for k in range(NUM_SESSIONS)]
    lines = "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in sessions)
    (out_dir / JSONL_NAME).write_text(lines)
    agents = [s["turns"] for s in sessions] + [
        t for s in sessions for t in s.get("subagents", {}).values()]
    tool_turns = [t for a in agents for t in a if "tool_result_len" in t]
    meta = {
        "name": "agentic-coding",
        "description": "Coding-agent sessions: a task, then a loop of tool calls and tool "
                       "results with tool latencies; some sessions fan out to sub-agents. "
                       "Lengths only; drawn from TraceLab's published statistics.",
        "source": SOURCE,
        "assumed": ASSUMED,
        "seed": SEED,
        "builder": "workloads/build_agentic_coding.py",
        "sessions": NUM_SESSIONS,
        "sessions_with_subagents": sum("subagents" in s for s in sessions),
        "turns": sum(len(a) for a in agents),
        "stats": {
            "main_agent_tool_steps": _stats([len(s["turns"]) - 1 for s in sessions]),
            "output_len": _stats([t["output_len"] for a in agents for t in a]),
            "tool_result_len": _stats([t["tool_result_len"] for t in tool_turns]),
            "tool_time_ms": _stats([t["tool_time_ms"] for t in tool_turns]),
        },
        "note": "Steps per session are cut where the context would pass max_context_len, so "
                "the long tail of the source's steps (p90 20, p99 86) is shorter here.",
    }
    (out_dir / META_NAME).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = ap.parse_args()
    meta = build(args.out)
    print(f"{meta['sessions']} sessions ({meta['sessions_with_subagents']} with sub-agents), "
          f"{meta['turns']} turns -> {args.out / JSONL_NAME}")


if __name__ == "__main__":
    main()
