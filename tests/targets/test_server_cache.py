"""The prefix cache's hits as the server reports them (usage.prompt_tokens_details.
cached_tokens) beside the engine's own figure, on one workload: `cbbench serve
--enable-prefix-caching` over HTTP, and the same engine in-process (issue 24). `cbbench run` is
the console script's entry in this process (helpers.cli_in_process), not a process that only
added ~1 CPU-s of start-up imports; the server is a real process."""

from __future__ import annotations

import json

from helpers import cli_in_process, serve_process

ENGINE = ("--engine", "sim", "--model", "llama-3-8b", "--gpu", "H200", "--enable-prefix-caching",
          "--block-size", "16")
SHARED = list(range(1, 161))  # 10 blocks of 16 shared by every request


def _workload(path) -> None:
    with open(path, "w") as f:
        for i in range(6):
            ids = SHARED + [200 + 10 * i + j for j in range(20)]
            f.write(json.dumps({"prompt_token_ids": ids, "output_len": 4}) + "\n")


def _run(tmp_path, name: str, *target: str) -> dict:
    out = cli_in_process(
        ["run", *target, "--workload", str(tmp_path / "w.jsonl"), "--num-requests",
         "6", "--request-rate", "4", "--arrival", "constant", "--output",
         str(tmp_path / f"{name}.json")],
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "server prefix cache hit rate" in out.stdout or name == "engine"
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_server_side_hit_rate_matches_the_log_and_the_engine(tmp_path):
    _workload(tmp_path / "w.jsonl")
    log = tmp_path / "log.jsonl"
    with serve_process(*ENGINE, "--request-log", str(log)) as srv:
        http = _run(tmp_path, "http", "--endpoint", srv.url, "--api", "completions")
    engine = _run(tmp_path, "engine", *ENGINE)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    cache = http["summary"]["server_prefix_cache"]
    # The client's sum is the server's own, request by request.
    by_id = {x["id"]: x["cached_tokens"] for x in lines}
    for r in http["requests"]:
        assert r["cached_tokens"] == by_id[r["server_request_id"]]
    assert cache["cached_tokens"] == sum(by_id.values())
    # Spaced out, every request after the first finds the 10 shared blocks cached.
    assert cache["cached_tokens"] == 5 * len(SHARED)
    assert cache["hit_rate"] == 5 * len(SHARED) / (6 * (len(SHARED) + 20))
    assert engine["summary"]["engine"]["prefix_cache_hit_tokens"] == cache["cached_tokens"]


def _vllm_record(i: int, cached: int | None, endpoint: str = "http://a", turn: int | None = None):
    from cbbench.analysis.records import RequestRecord

    return RequestRecord(i, 150, 4, 0.0, token_times_s=[0.1, 0.2], server_prompt_tokens=150,
                         cached_tokens=cached, endpoint=endpoint, session_id=0, turn=turn)


def test_a_usage_vllm_leaves_without_cached_tokens_is_a_miss_not_left_out():
    """vLLM writes prompt_tokens_details only when the count is non-zero (serving.py: `if
    self.enable_prompt_tokens_details and num_cached_tokens`): the first of 5 requests sharing
    48 cached tokens carries none. Its 150 tokens are a miss, so the rate is 192 / 750, as
    vllm:prefix_cache_hits / queries say; an endpoint that never sent the field says nothing."""
    from cbbench.analysis.server_side.server_cache import server_prefix_cache
    from cbbench.analysis.summary.turns import by_turn

    recs = [_vllm_record(0, None, turn=1)] + [_vllm_record(i, 48, turn=2) for i in range(1, 5)]
    cache = server_prefix_cache(recs)
    assert cache == {"requests": 5, "cached_tokens": 192, "prompt_tokens": 750,
                     "hit_rate": 192 / 750}
    # By turn too: turn 1 (no hit anywhere on it) is a 0 rate, not "the server reported none".
    assert by_turn(recs)[0]["server_prefix_cache"]["hit_rate"] == 0.0
    # Beside it, an endpoint that never reported cached tokens (--balance) is left out.
    other = [_vllm_record(9, None, endpoint="http://b")]
    assert server_prefix_cache(recs + other) == cache
    assert server_prefix_cache(other) is None
