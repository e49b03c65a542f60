"""Smaller ones (issue 25, rule 9): a Mooncake trace whose first line is over 64 KiB was not
recognised (the format was sniffed from a 64 KiB peek) and the error blamed the JSONL format;
`--replay` silently ignored `--workload` (and, found beyond the issue's list, `--seed`,
`--burstiness`, `--arrival` and `--time-scale`: the recorded run's values stood).
"""

from __future__ import annotations

import json

import pytest
from helpers import invoke_app

from cbbench.load.traces import MOONCAKE_BLOCK_TOKENS

SIM = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]


def cli(*args):
    return invoke_app([str(a) for a in args])


def test_a_mooncake_trace_with_a_first_line_over_64_kib_loads(tmp_path):
    blocks = 12_000  # hash ids of 5-6 digits: a first line of ~80 KiB
    first = {"timestamp": 0, "input_length": blocks * MOONCAKE_BLOCK_TOKENS, "output_length": 4,
             "hash_ids": list(range(100_000, 100_000 + blocks))}
    line = json.dumps(first)
    assert len(line) > 64 * 1024
    t = tmp_path / "mooncake.jsonl"
    t.write_text(line + "\n" + json.dumps({"timestamp": 500, "input_length": 40,
                                             "output_length": 4, "hash_ids": [1]}) + "\n")
    out = tmp_path / "r.json"
    res = cli("run", *SIM, "--workload", t, "--max-error-rate", "1", "--output", out)
    assert res.exit_code == 0, (res.output, res.exception)
    result = json.loads(out.read_text())
    assert len(result["requests"]) == 2
    # The first request is the trace's (6 million tokens: beyond the context, rejected).
    assert result["requests"][0]["prompt_tokens"] == blocks * MOONCAKE_BLOCK_TOKENS


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "r.json"
    assert cli("run", *SIM, "--num-requests", "4", "--request-rate", "5",
               "--output", out).exit_code == 0
    return out


@pytest.mark.parametrize("flags", [
    ["--workload", "long-prompt"],
    ["--seed", "7"], ["--burstiness", "0.5"], ["--arrival", "constant"], ["--time-scale", "2"],
], ids=["workload", "seed", "burstiness", "arrival", "time-scale"])
def test_replay_refuses_what_it_would_ignore(recorded, tmp_path, flags):
    out = tmp_path / "z.json"
    res = cli("run", *SIM, "--replay", recorded, *flags, "--output", out)
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: --replay takes"), res.stderr
    assert f"drop {flags[0]}" in lines[0]
    assert not out.exists()


def test_replay_alone_still_runs(recorded, tmp_path):
    out = tmp_path / "z.json"
    res = cli("run", *SIM, "--replay", recorded, "--output", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["summary"]["completed"] == 4
