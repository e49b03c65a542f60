"""Workload fields reasoning_len, tools and tool_choice (issue 24): bad values are one line and
exit 2; an in-process run splits its reasoning from reasoning_len. `cbbench run` is the console
script's entry in this process (helpers.cli_in_process: its status, stdout and stderr apart),
not a process that only added ~1 CPU-s of start-up imports a case."""

from __future__ import annotations

import json

import pytest
from helpers import CliOutcome, cli_in_process


def run(tmp_path, lines: list[dict], *extra: str) -> CliOutcome:
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return cli_in_process(
        ["run", "--engine", "sim", "--workload", str(wl), "--num-requests",
         str(len(lines)), "--output", str(tmp_path / "r.json"), *extra],
    )


@pytest.mark.parametrize("line,message", [
    ({"prompt_len": 8, "output_len": 4, "reasoning_len": -1}, "'reasoning_len' must be >= 0"),
    ({"prompt_len": 8, "output_len": 4, "reasoning_len": 5}, "is above 'output_len' 4"),
    ({"prompt_len": 8, "output_len": 4, "reasoning_len": "2"}, "must be an integer"),
    ({"prompt_len": 8, "output_len": 4, "tool_choice": "required"},
     "'tool_choice' without 'tools' (a tool turn needs tools)"),
    ({"prompt_len": 8, "output_len": 4, "tools": [{"type": "function"}]}, "'tools' must be"),
    ({"prompt_len": 8, "output_len": 4, "tools": [{"type": "function", "function": {
        "name": "a"}}], "tool_choice": {"type": "function", "function": {"name": "b"}}},
     "must name a function in 'tools'"),
])
def test_bad_output_kind_is_one_line(tmp_path, line, message):
    out = run(tmp_path, [line])
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("cbbench: error: ") and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def test_in_process_run_splits_reasoning(tmp_path):
    lines = [{"prompt_len": 16, "output_len": 10, "reasoning_len": 4},
             {"prompt_len": 16, "output_len": 6}]
    out = run(tmp_path, lines)
    assert out.returncode == 0, out.stderr
    assert "TTFOT (ms)" in out.stdout and "reasoning tokens" in out.stdout
    res = json.loads((tmp_path / "r.json").read_text())
    a, b = sorted(res["requests"], key=lambda r: r["id"])
    assert a["reasoning_tokens"] == 4 and b["reasoning_tokens"] is None
    assert a["ttfot_ms"] > a["ttft_ms"] and b["ttfot_ms"] == b["ttft_ms"]
    s = res["summary"]
    assert s["reasoning_tokens"]["count"] == 1 and s["reasoning_tokens"]["mean"] == 4
    assert s["ttfot_ms"]["count"] == 2
    # One token per step in-process: per-token ITL is the event gap.
    assert s["tokens_per_event"]["mean"] == 1
    assert s["itl_ms"]["p50"] == pytest.approx(s["event_gap_ms"]["p50"])
