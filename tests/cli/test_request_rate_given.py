"""--request-rate counts as given by how it was given, not by its text: on a timed workload
`--arrival auto` replays the trace's own times only when no --request-rate is given (its help),
so an explicit inf in any spelling parse_rate takes sends everything at t=0, and the default
still replays the trace. (Before, only the text "inf" read as not given: `--request-rate inf`
replayed the trace at 0, 1, 2, 3, 4 s while `--request-rate INF` sent all five at 0.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import cli_in_process

SIM = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--quiet"]
N = 5


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """100 requests at arrival_s 100, 101, ..., 199: offsets 0, 1, 2, ... s."""
    path = tmp_path_factory.mktemp("rate") / "tr.jsonl"
    path.write_text("".join(json.dumps({"prompt_len": 50 + k, "output_len": 10,
                                        "arrival_s": 100.0 + k}) + "\n" for k in range(100)))
    return path


def _run(trace: Path, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "r.json"
    res = cli_in_process([*SIM, "--workload", str(trace), "--num-requests", str(N),
                          "--output", str(out), *flags])
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("spelling", ["inf", "INF", "Infinity", "+inf"])
def test_an_explicit_inf_in_any_spelling_sends_all_at_once(trace, tmp_path, spelling):
    result = _run(trace, tmp_path, "--request-rate", spelling)
    assert result["config"]["arrival"] == "gamma"
    assert result["config"]["request_rate"] == "inf"
    assert [r["intended_start_s"] for r in result["requests"]] == [0.0] * N


def test_without_the_flag_the_trace_s_own_times_are_kept(trace, tmp_path):
    result = _run(trace, tmp_path)
    assert result["config"]["arrival"] == "trace"
    assert sorted(r["intended_start_s"] for r in result["requests"]) == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("flags,error", [
    # Given, so refused where a rate does nothing, as --request-rate 5 is.
    (["--request-rate", "inf", "--arrival", "trace"],
     "--arrival trace replays the trace's own arrival_s: drop --request-rate"),
    (["--request-rate", "inf", "--ramp", "1:5:2"], "--ramp sets the request rate"),
    # At rate inf --burstiness does nothing in any spelling (INF took it, exit 0).
    (["--request-rate", "INF", "--burstiness", "0.5"],
     "--burstiness shapes the gaps between arrivals: at --request-rate inf"),
])
def test_an_explicit_inf_is_refused_where_a_rate_does_nothing(trace, tmp_path, flags, error):
    res = cli_in_process([*SIM, "--workload", str(trace), "--output", str(tmp_path / "r.json"),
                          *flags])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: ") and error in lines[0]
