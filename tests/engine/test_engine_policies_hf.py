"""Swap preemption, prefix caching and priority scheduling on the torch engine, against Hugging
Face ``generate`` (CPU, fp32, greedy).

As in test_engine_hf_equivalence.py: a tiny random-weight Llama is saved with
``save_pretrained`` and loaded by cbbench FROM THAT FOLDER through the real CLI (``cbbench run
--workload FILE.jsonl --engine torch --model FOLDER --save-detailed``); every request's output
token ids must equal what ``transformers`` generates for that request alone. The policies move
real KV: swapped-out blocks are copied to a CPU tensor pool and back into different GPU blocks,
and prefix-cache hits make the model runner compute only the uncached tokens on top of blocks
another request wrote. Each test also asserts, from the result's iterations and summary, that
swapping or cache hits really happened.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from helpers import TINY_VOCAB, hf_greedy, tiny_hf_model  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from cbbench.cli.app import app  # noqa: E402

VOCAB = TINY_VOCAB
# (prompt length, output length, priority): ragged prompts, all arriving at t = 0 (a timed
# trace, so it is replayed whole), so the schedule does not depend on wall-clock timing.
RAGGED = [
    (3, 12, 1), (40, 8, 1), (17, 20, 0), (9, 6, 1), (33, 15, 0), (5, 18, 1), (26, 10, 0),
    (12, 7, 1),
]  # fmt: skip
# Shared-prefix groups: (group, suffix length, output length, priority). Each group's system
# prompt is 22-37 tokens, so several 4-token blocks are shared.
SYSTEM_LENS = [37, 22, 29]
SHARED = [
    (0, 5, 9, 1), (1, 3, 12, 1), (0, 8, 6, 0), (2, 4, 10, 1), (0, 1, 11, 1),
    (1, 9, 7, 0), (2, 6, 8, 1), (0, 5, 5, 1), (1, 2, 13, 1), (2, 7, 6, 0),
]  # fmt: skip

BASE = ["--engine", "torch", "--device", "cpu", "--dtype", "fp32", "--save-detailed",
        "--attention-backend", "reference"]  # fmt: skip
# Block size 4 and 16 blocks (64 token slots): the largest request (33 + 15 - 1 tokens) fits
# alone, the eight together need ~70 blocks -> preemption.
SMALL_POOL = ["--block-size", "4", "--num-kv-blocks", "16"]
# 0.001 GiB of swap: ~524 blocks of 2 KiB (4 tokens x 2 layers x K,V x 2 heads x 16 x fp32).
SWAP = ["--preemption", "swap", "--swap-space", "0.001"]
CHUNKED = ["--max-num-batched-tokens", "16"]
CACHING = ["--enable-prefix-caching"]


def _ragged_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (p,), generator=g).tolist() for p, _, _ in RAGGED]


def _shared_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    systems = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in SYSTEM_LENS]
    return [
        systems[group] + torch.randint(0, VOCAB, (suffix,), generator=g).tolist()
        for group, suffix, _, _ in SHARED
    ]


def _write(path: Path, prompts, outputs, priorities) -> Path:
    lines = [
        json.dumps({"prompt_token_ids": ids, "output_len": out, "priority": pr, "arrival_s": 0.0})
        for ids, out, pr in zip(prompts, outputs, priorities, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


class Case:
    def __init__(self, root: Path) -> None:
        hf = tiny_hf_model("llama")
        self.folder = root / "hf-llama"
        hf.save_pretrained(self.folder)
        ragged = _ragged_prompts()
        self.ragged = _write(
            root / "ragged.jsonl", ragged, [o for _, o, _ in RAGGED], [p for _, _, p in RAGGED]
        )
        self.ragged_expected = hf_greedy(hf, ragged, [o for _, o, _ in RAGGED])
        shared = _shared_prompts()
        self.shared = _write(
            root / "shared.jsonl", shared, [o for *_, o, _ in SHARED], [p for *_, p in SHARED]
        )
        self.shared_expected = hf_greedy(hf, shared, [o for *_, o, _ in SHARED])

    def run(self, out: Path, workload: Path, *flags: str) -> dict:
        args = ["run", "--workload", str(workload), "--model", str(self.folder), *BASE, *flags,
                "--output", str(out)]  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        return json.loads(out.read_text())

    @staticmethod
    def check(result: dict, expected: list[list[int]]) -> None:
        reqs = {r["id"]: r for r in result["requests"]}
        assert sorted(reqs) == list(range(len(expected)))
        assert result["summary"]["completed"] == len(expected)
        for i, want in enumerate(expected):
            got = reqs[i]["output_token_ids"]
            assert got == want, f"request {i}\n cbbench: {got}\n     HF: {want}"


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Case:
    return Case(tmp_path_factory.mktemp("policies"))


def _totals(result: dict) -> dict:
    its = result["iterations"]
    return {
        k: sum(it[k] for it in its)
        for k in ("num_preempted", "num_swapped_out_blocks", "num_swapped_in_blocks",
                  "num_cached_tokens")
    }  # fmt: skip


# ---- swap preemption ------------------------------------------------------------------------
@pytest.mark.parametrize("chunked", [False, True], ids=["whole-prompts", "chunked"])
def test_swap_preemption_matches_hf(case, tmp_path, chunked):
    flags = [*SMALL_POOL, *SWAP, *(CHUNKED if chunked else [])]
    result = case.run(tmp_path / "swap.json", case.ragged, *flags)
    case.check(result, case.ragged_expected)
    t = _totals(result)
    assert t["num_swapped_out_blocks"] > 0, "the small pool never swapped"
    assert t["num_swapped_in_blocks"] == t["num_swapped_out_blocks"]  # every swap came back
    assert result["config"]["preemption"] == "swap" and result["config"]["num_cpu_blocks"] > 0
    assert result["summary"]["engine"]["num_swapped_out_blocks"] == t["num_swapped_out_blocks"]
    assert result["summary"]["engine"]["swap_time_s"] > 0
    assert any(it["swap_time_s"] > 0 for it in result["iterations"])


def test_swap_space_too_small_falls_back_to_recompute_and_still_matches(case, tmp_path):
    # 2 KiB of swap: one block. Victims needing more are recomputed.
    flags = [*SMALL_POOL, "--preemption", "swap", "--swap-space", str(2048 / 1024**3)]
    result = case.run(tmp_path / "tiny-swap.json", case.ragged, *flags)
    case.check(result, case.ragged_expected)
    t = _totals(result)
    assert result["config"]["num_cpu_blocks"] == 1
    assert t["num_preempted"] > t["num_swapped_out_blocks"]  # most preemptions recomputed


# ---- prefix caching ---------------------------------------------------------------------------
def test_prefix_caching_matches_hf(case, tmp_path):
    # Two at a time: later requests find their group's system prompt in the cache.
    flags = [*CACHING, "--block-size", "4", "--max-num-seqs", "2"]
    result = case.run(tmp_path / "prefix.json", case.shared, *flags)
    case.check(result, case.shared_expected)
    engine = result["summary"]["engine"]
    assert engine["prefix_cache_hit_tokens"] >= 4 * 5 * 4  # several blocks for most requests
    assert 0 < engine["prefix_cache_hit_rate"] < 1
    # Hits are computed, not just counted: the prefill work shrank by exactly the hits.
    plain = case.run(
        tmp_path / "plain.json", case.shared, "--block-size", "4", "--max-num-seqs", "2"
    )
    case.check(plain, case.shared_expected)
    assert plain["summary"]["engine"]["prefix_cache_hit_tokens"] == 0
    assert plain["summary"]["engine"]["prefix_cache_hit_rate"] is None
    saved = plain["summary"]["engine"]["total_prefill_tokens"] - engine["total_prefill_tokens"]
    assert saved == engine["prefix_cache_hit_tokens"]


def test_prefix_caching_with_chunks_and_preemption_matches_hf(case, tmp_path):
    flags = [*CACHING, *SMALL_POOL, *CHUNKED]
    result = case.run(tmp_path / "prefix-preempt.json", case.shared, *flags)
    case.check(result, case.shared_expected)
    t = _totals(result)
    assert t["num_cached_tokens"] > 0 and t["num_preempted"] > 0


# ---- everything at once ---------------------------------------------------------------------
def test_swap_priority_and_prefix_caching_together_match_hf(case, tmp_path):
    flags = [*CACHING, *SMALL_POOL, *SWAP, *CHUNKED, "--policy", "priority"]
    result = case.run(tmp_path / "all.json", case.shared, *flags)
    case.check(result, case.shared_expected)
    t = _totals(result)
    assert t["num_cached_tokens"] > 0 and t["num_swapped_out_blocks"] > 0
    assert set(result["summary"]["per_priority"]) == {"0", "1"}
    ragged = case.run(tmp_path / "all-ragged.json", case.ragged, *SMALL_POOL, *SWAP,
                      "--policy", "priority")  # fmt: skip
    case.check(ragged, case.ragged_expected)
    assert _totals(ragged)["num_swapped_out_blocks"] > 0


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_prefix_scheduled_in_its_own_step_is_read_right(case, tmp_path, backend):
    # Three requests at t = 0, 4-token blocks: a 12-token prompt, its twin, and the same prompt
    # plus 2 tokens. As vLLM V1 does, the twin and the longer one find the first's blocks in
    # the step that computes them (12 + 4 + 2 tokens computed, 20 cached), so their attention
    # reads KV the same forward wrote a layer's kernel launch earlier: the reference backend
    # and the Triton kernels (under the interpreter here; on a GPU untested) must give HF's
    # tokens.
    if backend == "triton":
        pytest.importorskip("triton")
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, VOCAB, (14,), generator=g).tolist()
    prompts, outputs = [prompt[:12], prompt[:12], prompt], [5, 5, 5]
    hf = transformers.AutoModelForCausalLM.from_pretrained(case.folder)
    expected = hf_greedy(hf, prompts, outputs)
    workload = _write(tmp_path / "same_step.jsonl", prompts, outputs, [1, 1, 1])
    base = [a for a in BASE if a not in ("--attention-backend", "reference")]
    out = tmp_path / "same_step.json"
    res = CliRunner().invoke(app, [
        "run", "--workload", str(workload), "--model", str(case.folder), *base,
        "--attention-backend", backend, *CACHING, "--block-size", "4", "--num-kv-blocks", "32",
        "--max-model-len", "64", "--output", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    case.check(result, expected)
    first = result["iterations"][0]
    assert (first["num_prefill_tokens"], first["num_cached_tokens"]) == (18, 20)
