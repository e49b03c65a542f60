"""Published trace rows, copied exactly from each project's own files, read by cbbench and
replayed: counts, which column is input and which output, the intended start times (offsets
from the first timestamp, times --time-scale), Mooncake's hash_ids as shared 512-token blocks,
and what `cbbench workloads show` says of them. Expected values computed by hand.

Sources (a few rows each; CC-BY 4.0 for Azure and BurstGPT, Apache-2.0 for Mooncake):
- Azure: github.com/Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_code.csv, rows 1-4
  (CRLF line ends, as published).
- BurstGPT: github.com/HPMLL/BurstGPT, BurstGPT_1.csv rows 1-3 (as its README and AIPerf's tests
  quote them) and release v2.0's BurstGPT_3.csv rows 1-4 (Session ID, Elapsed time).
- Mooncake: github.com/kvcache-ai/Mooncake, FAST25-release/README.md's two sample requests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import invoke_app, run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.load.workload import load_workload

AZURE_CODE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:04.0781490,110,27
2023-11-16 18:17:04.1206440,7433,14
""".replace("\n", "\r\n")  # the published file's line ends
# 04.0319600 - 03.9799600 = 0.052 s; 04.0781490 - 03.9799600 = 0.098189; 04.1206440: 0.140684
AZURE_CODE_EXPECTED = [(0.0, 4808, 10), (0.052, 3180, 8), (0.098189, 110, 27),
                       (0.140684, 7433, 14)]

BURSTGPT_3 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
19440110.0,1722ac82-0a46-4bf0-aa08-89794e7a2b3f,43,GPT-4,906,446,1352,Conversation log
19440161.0,d5983bf9-4b48-497b-892b-a58995247443,2,ChatGPT,36,29,65,Conversation log
19440192.0,a5c69b35-4fbc-45e9-955e-18715e376d74,8,GPT-4,1779,123,1902,Conversation log
19440254.0,8b74c7d8-1643-4bba-8c69-91cb4548c506,3,ChatGPT,935,178,1113,Conversation log
"""
BURSTGPT_3_EXPECTED = [(0.0, 906, 446), (51.0, 36, 29), (82.0, 1779, 123), (144.0, 935, 178)]

# BurstGPT_1.csv's first rows, then a failed request (Response tokens 0) as the trace has them.
BURSTGPT_1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,230,1317,Conversation log
118,GPT-4,417,276,693,Conversation log
120,GPT-4,300,0,300,API log
"""

MOONCAKE = """{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}
{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}
"""
# 30535 - 27482 = 3053 ms; the two share hash ids 46-57: 12 blocks of 512 = 6,144 tokens.
MOONCAKE_EXPECTED = [(0.0, 6955, 52), (3.053, 6472, 26)]
SHARED_PREFIX_TOKENS = 12 * 512

FILES = {
    "AzureLLMInferenceTrace_code.csv": (AZURE_CODE, AZURE_CODE_EXPECTED),
    "BurstGPT_3.csv": (BURSTGPT_3, BURSTGPT_3_EXPECTED),
    "mooncake_readme.jsonl": (MOONCAKE, MOONCAKE_EXPECTED),
}
SIM = EngineArgs(engine="sim", gpu="h200", model="llama-3.1-8b", enable_prefix_caching=True)


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_published_rows_replay_at_their_offsets(tmp_path: Path, name: str, scale: float) -> None:
    text, expected = FILES[name]
    path = tmp_path / name
    path.write_bytes(text.encode())
    spec = run_spec(workload=str(path), num_requests=None, arrival="trace", engine=SIM,
                    time_scale=scale)
    result = execute_run(spec)
    reqs = sorted(result.requests, key=lambda r: r.id)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [e[1:] for e in expected]
    assert [r.intended_start_s for r in reqs] == pytest.approx(
        [e[0] * scale for e in expected], abs=1e-9)
    if name.startswith("mooncake"):
        # The second request arrives after the first finished: its 12 shared blocks are hits.
        assert result.summary.engine.prefix_cache_hit_tokens == SHARED_PREFIX_TOKENS


def test_a_blank_line_before_the_header_is_read_as_the_format_detects_it(tmp_path: Path) -> None:
    """detect_format skips blank lines to find the header; the CSV reader took the blank line
    as the header and raised ValueError ('TIMESTAMP' is not in list), a traceback."""
    for name, text in (("azure.csv", AZURE_CODE), ("burst.csv", BURSTGPT_3)):
        path = tmp_path / name
        path.write_bytes(("\n\r\n" + text).encode())
        w = load_workload(str(path))
        assert [(r.prompt_len, r.output_len) for r in w.requests] == [
            e[1:] for e in FILES["AzureLLMInferenceTrace_code.csv" if name == "azure.csv"
                                 else "BurstGPT_3.csv"][1]]
        # A byte-order mark on the blank first line, as an editor saving UTF-8 with BOM writes.
        path.write_bytes(("\ufeff\n" + text).encode())
        assert len(load_workload(str(path)).requests) == 4


def test_workloads_show_counts_the_rows_it_skipped(tmp_path: Path) -> None:
    """`workloads show` printed "3 requests" of BurstGPT_1's four rows and nothing of the failed
    one it left out, which a run reports; a user sizing a replay read the file as 3 rows."""
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT_1)
    res = invoke_app(["workloads", "show", str(path)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("BurstGPT_1.csv: 3 requests.")
    assert "skipped 1 rows with 0 prompt or output tokens" in res.output
    assert "trace arrivals over 113.0 s" in res.output  # 118 - 5


def test_workloads_show_gives_the_span_the_replay_sends(tmp_path: Path) -> None:
    """A JSONL file's arrival_s need not start at 0: the replay sends 5.5, 6 and 7 at 0, 0.5
    and 1.5 s (offsets from the first), but show said "trace arrivals over 7.0 s"."""
    path = tmp_path / "timed.jsonl"
    path.write_text('{"prompt_len": 100, "output_len": 10, "arrival_s": 5.5}\n'
                    '{"prompt_len": 30, "output_len": 3, "arrival_s": 7}\n'
                    '{"prompt_len": 20, "output_len": 4, "arrival_s": 6}\n')
    res = invoke_app(["workloads", "show", str(path)])
    assert res.exit_code == 0, res.output
    assert "trace arrivals over 1.5 s" in res.output
    starts = sorted(r.intended_start_s for r in execute_run(run_spec(
        workload=str(path), num_requests=None, arrival="trace", engine=SIM)).requests)
    assert starts == pytest.approx([0.0, 0.5, 1.5])
