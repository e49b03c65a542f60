"""Public trace formats (Azure LLM inference 2023/2024, BurstGPT, Mooncake), each from a small
file written here from the format's published description: request count, lengths and (with
--arrival trace) intended start times exactly as in the file; a malformed trace gets one line
and exit code 2.

Published descriptions used:
- Azure: github.com/Azure/AzurePublicDataset, AzureLLMInferenceDataset2023.md / 2024.md (schema
  TIMESTAMP, ContextTokens, GeneratedTokens; the 2024 notebook shows both
  "2024-05-12 00:00:00.001163+00:00" and "2024-05-12 00:00:00+00:00").
- BurstGPT: github.com/HPMLL/BurstGPT README (Timestamp in seconds from the first day's 0:00,
  Model, Request tokens, Response tokens, Total tokens, Log Type; release 2 adds Session ID and
  Elapsed time; failed requests have 0 response tokens).
- Mooncake: github.com/kvcache-ai/Mooncake FAST25-release traces (timestamp in ms,
  input_length, output_length, hash_ids of 512-token blocks).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import invoke_app, run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.hash_blocks import MOONCAKE_BLOCK_TOKENS, expand_hash_ids, hash_block_ids
from cbbench.load.traces import detect_format, parse_azure_time
from cbbench.load.workload import load_workload

AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0120000,879,0
2023-11-16 18:16:02.1000000,1233,15
"""
# (offset from the first timestamp in s, prompt, output) for the rows kept (row 3 generated 0)
AZURE_2023_EXPECTED = [(0.0, 374, 44), (4.314579, 396, 109), (15.41941, 1233, 15)]

AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-12 00:00:00.001163+00:00,1452,3
2024-05-12 00:00:00.041683+00:00,584,3
2024-05-12 00:00:01+00:00,862,38
2024-05-12 00:00:02.248279+00:00,617,104
"""
AZURE_2024_EXPECTED = [(0.0, 1452, 3), (0.04052, 584, 3), (0.998837, 862, 38),
                       (2.247116, 617, 104)]

BURSTGPT_V1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,230,1317,Conversation log
118,GPT-4,417,276,693,Conversation log
1106,ChatGPT,0,0,0,Conversation log
1129,ChatGPT,1305,477,1782,API log
"""
BURSTGPT_V1_EXPECTED = [(0.0, 472, 18), (40.0, 1087, 230), (113.0, 417, 276),
                        (1124.0, 1305, 477)]

BURSTGPT_V2 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
12.5,1001,3.2,ChatGPT,300,50,350,Conversation log
13.25,1001,4.0,ChatGPT,400,60,460,Conversation log
20,,1.5,GPT-4,100,10,110,API log
"""
BURSTGPT_V2_EXPECTED = [(0.0, 300, 50), (0.75, 400, 60), (7.5, 100, 10)]

MOONCAKE = """{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}
{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}
{"timestamp": 27482, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}
{"timestamp": 30000, "input_length": 1100, "output_length": 8, "hash_ids": [46, 48, 49]}
"""
MOONCAKE_EXPECTED = [(0.0, 655, 52), (10.535, 672, 26), (27.482, 655, 52), (30.0, 1100, 8)]

FILES = {
    "azure2023.csv": (AZURE_2023, "azure", AZURE_2023_EXPECTED),
    "azure2024.csv": (AZURE_2024, "azure", AZURE_2024_EXPECTED),
    "burstgpt.csv": (BURSTGPT_V1, "burstgpt", BURSTGPT_V1_EXPECTED),
    "burstgpt_v2.csv": (BURSTGPT_V2, "burstgpt", BURSTGPT_V2_EXPECTED),
    "mooncake.jsonl": (MOONCAKE, "mooncake", MOONCAKE_EXPECTED),
}
SIM = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b")


def _write(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(FILES[name][0])
    return path


@pytest.mark.parametrize("name", sorted(FILES))
def test_trace_loads_exactly_as_written(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, name)
    _, fmt, expected = FILES[name]
    assert detect_format(path) == fmt
    w = load_workload(str(path))
    assert w.has_arrivals
    got = [(r.arrival_s, r.prompt_len, r.output_len) for r in w.requests]
    assert [g[1:] for g in got] == [e[1:] for e in expected]
    assert [g[0] for g in got] == pytest.approx([e[0] for e in expected], abs=1e-9)


@pytest.mark.parametrize("name", sorted(FILES))
def test_arrival_trace_replays_the_file_s_times(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, name)
    expected = FILES[name][2]
    spec = run_spec(workload=str(path), num_requests=None, arrival="trace", engine=SIM)
    result = execute_run(spec)
    reqs = sorted(result.requests, key=lambda r: r.id)
    assert result.config.arrival == "trace"
    assert len(reqs) == len(expected) == result.summary.completed
    assert [r.intended_start_s for r in reqs] == pytest.approx(
        [e[0] for e in expected], abs=1e-9
    )
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [e[1:] for e in expected]


def test_time_scale_stretches_and_compresses(tmp_path: Path) -> None:
    path = _write(tmp_path, "burstgpt.csv")
    for scale in (0.5, 3.0):
        spec = run_spec(workload=str(path), num_requests=None, arrival="trace", engine=SIM,
                       time_scale=scale)
        result = execute_run(spec)
        starts = sorted(r.intended_start_s for r in result.requests)
        assert starts == pytest.approx([e[0] * scale for e in BURSTGPT_V1_EXPECTED])
        assert result.config.time_scale == scale


def test_time_scale_needs_trace_arrivals(tmp_path: Path) -> None:
    path = _write(tmp_path, "azure2023.csv")
    spec = run_spec(workload=str(path), num_requests=None, arrival="gamma", engine=SIM,
                   request_rate=5.0, time_scale=2.0)
    with pytest.raises(UsageError, match="--time-scale applies to --arrival trace"):
        execute_run(spec)


def _timed_jsonl(tmp_path: Path, lines: list[dict]) -> Path:
    import json

    path = tmp_path / "timed.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


# 100 requests at arrival_s 100, 101, ..., 199: offsets 0..99 s. --duration 10s keeps every
# request whose SCALED offset is under 10 s: k * 0.5 < 10 for k = 0..19 (20), k * 2 < 10 for
# k = 0..4 (5). Counted on the unscaled trace, both sent 10 (at 0-4.5 s, then at 0-18 s).
@pytest.mark.parametrize("scale,expected", [(0.5, 20), (2.0, 5), (1.0, 10)])
def test_duration_counts_on_the_time_scaled_trace(tmp_path: Path, scale: float,
                                                  expected: int) -> None:
    path = _timed_jsonl(tmp_path, [{"prompt_len": 50 + k, "output_len": 10,
                                    "arrival_s": 100.0 + k} for k in range(100)])
    spec = run_spec(workload=str(path), num_requests=None, duration="10s", time_scale=scale,
                    engine=SIM)
    result = execute_run(spec)
    starts = sorted(r.intended_start_s for r in result.requests)
    assert result.config.arrival == "trace"
    assert len(starts) == expected == result.config.num_requests
    assert starts == pytest.approx([k * scale for k in range(expected)])
    assert starts[-1] < 10.0


# The same rule for a timed session file: sessions at arrival_s 0..9, --duration 4s. First
# turns at k * 0.5 < 4: k = 0..7 (8 sessions); at k * 2 < 4: k = 0, 1 (2). Both were 4.
@pytest.mark.parametrize("scale,expected", [(0.5, 8), (2.0, 2)])
def test_duration_counts_timed_sessions_on_the_time_scaled_trace(
        tmp_path: Path, scale: float, expected: int) -> None:
    path = _timed_jsonl(tmp_path, [
        {"session_id": f"s{k}", "arrival_s": float(k),
         "turns": [{"user_len": 20, "output_len": 4}, {"user_len": 10, "output_len": 4}]}
        for k in range(10)])
    spec = run_spec(workload=str(path), num_requests=None, duration="4s", time_scale=scale,
                    think_time="0", engine=SIM)
    result = execute_run(spec)
    first = sorted(r.intended_start_s for r in result.requests if r.turn == 1)
    assert result.config.arrival == "trace"
    assert result.config.num_requests == expected == len(first)
    assert first == pytest.approx([k * scale for k in range(expected)])


def test_failed_rows_are_skipped_and_reported(tmp_path: Path, notices) -> None:
    w = load_workload(str(_write(tmp_path, "burstgpt.csv")))
    assert len(w.notes) == 1 and "skipped 1 rows" in w.notes[0]
    spec = run_spec(workload=str(_write(tmp_path, "azure2023.csv")), num_requests=None,
                   engine=SIM)
    execute_run(spec)
    assert any("skipped 1 rows" in n for n in notices)


def test_a_mooncake_row_with_0_output_tokens_is_skipped_as_in_the_csv_traces(tmp_path):
    """A Mooncake row with output_length 0 refused the whole file ("'output_length' must be an
    integer >= 1") where Azure and BurstGPT skip such rows and say how many."""
    path = tmp_path / "mooncake.jsonl"
    path.write_text(MOONCAKE + '{"timestamp": 40000, "input_length": 9, "output_length": 0}\n')
    w = load_workload(str(path))
    assert len(w.requests) == 4
    assert w.notes == ("mooncake.jsonl: skipped 1 rows with 0 prompt or output tokens "
                       "(failed requests in the trace)",)


def test_azure_times_are_exact_to_the_tick() -> None:
    a = parse_azure_time("2023-11-16 18:15:46.6805900", "x")
    b = parse_azure_time("2023-11-16 18:15:46.6805901", "x")
    assert b - a == 100  # one 100 ns tick
    # An offset moves the instant: 01:00+01:00 is 00:00 UTC.
    assert parse_azure_time("2024-05-12 01:00:00+01:00", "x") == parse_azure_time(
        "2024-05-12 00:00:00+00:00", "x"
    )


# ---- Mooncake hash blocks ---------------------------------------------------------------------
def test_hash_ids_become_shared_token_blocks(tmp_path: Path) -> None:
    w = load_workload(str(_write(tmp_path, "mooncake.jsonl")))
    ids = [r.token_ids() for r in w.requests]
    assert [len(x) for x in ids] == [655, 672, 655, 1100]
    assert ids[0] == ids[2]  # same hash ids, same length: the same prompt
    assert ids[0][:MOONCAKE_BLOCK_TOKENS] == hash_block_ids(46) == ids[3][:MOONCAKE_BLOCK_TOKENS]
    # Block 47 is cut to each prompt's length: request 0 holds a prefix of request 1's.
    assert ids[1][:655] == ids[0]
    assert ids[3][MOONCAKE_BLOCK_TOKENS:2 * MOONCAKE_BLOCK_TOKENS] != ids[0][MOONCAKE_BLOCK_TOKENS:]
    # Fewer hash ids than the prompt fills: the rest is the request's own.
    tail = expand_hash_ids(7, (46,), 600)
    assert tail[:MOONCAKE_BLOCK_TOKENS] == hash_block_ids(46) and len(tail) == 600
    assert tail[MOONCAKE_BLOCK_TOKENS:] != expand_hash_ids(8, (46,), 600)[MOONCAKE_BLOCK_TOKENS:]


def test_mooncake_sharing_reaches_the_prefix_cache(tmp_path: Path) -> None:
    """Requests 0-2 share 655 leading tokens: with 16-token blocks, requests 1 and 2 find 40
    full blocks (640 tokens) each cached; request 3 finds block 46 (32 blocks, 512 tokens)."""
    path = _write(tmp_path, "mooncake.jsonl")
    engine = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", enable_prefix_caching=True)
    spec = run_spec(workload=str(path), num_requests=None, arrival="trace", engine=engine)
    summary = execute_run(spec).summary
    assert summary.engine.prefix_cache_hit_tokens == 640 + 640 + 512


# ---- malformed files: one line, exit 2 ---------------------------------------------------------
BAD = {
    "bad_time.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n",
    "bad_count.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,ten,5\n",
    "short_row.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10\n",
    "bad_burst.csv": BURSTGPT_V1.replace("472", "-472"),
    "unknown.csv": "time,prompt,output\n1,2,3\n",
    "bad_json.jsonl": MOONCAKE + '{"timestamp": 1, "input_length": 5\n',
    "missing.jsonl": '{"timestamp": 1, "input_length": 5, "hash_ids": []}\n'.replace(
        '"input_length": 5', '"input_length": 5, "output_length": 0'),
    "too_many_blocks.jsonl": '{"timestamp": 0, "input_length": 600, "output_length": 5, '
                             '"hash_ids": [1, 2, 3]}\n',
    "no_rows.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_trace_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(BAD[name])
    res = invoke_app(["run", "--engine", "sim", "--workload", str(path),
                      "--output", str(tmp_path / "r.json")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), res.output
    assert not (tmp_path / "r.json").exists()
