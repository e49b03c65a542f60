"""Speculative decoding on the torch engine against Hugging Face ``generate`` (CPU, fp32, greedy):
speculation may never change a greedy output.

The models are the equivalence tests' (tests/engine/test_engine_hf_equivalence.py): tiny random-weight
Llama and Qwen2 saved with ``save_pretrained`` and loaded from that folder through the real CLI.
The prompts repeat a short random segment three times, so prompt lookup finds n-grams from the
first decode on, and 40-odd greedy tokens of these models fall into loops it also finds: the
drafts are accepted about 40% of the time, so both paths of verification (accept, then the
bonus token; reject, then the correction and the KV rollback) run many times. Variants: a roomy
pool, chunked prefill (a 16-token budget), a pool small enough to preempt, both, swap preemption
with prefix caching, the static scheduler, and async scheduling (whose prediction of the next
step is skipped after a verify step).

A second test swaps in an oracle drafter (the HF tokens, corrupted at a drawn position) through
the engine's API: long accepted runs, rollbacks across block boundaries and K = 5.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
from helpers import TINY_VOCAB, hf_greedy, tiny_hf_model  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from cbbench.cli.app import app  # noqa: E402
from cbbench.engine.args import EngineArgs  # noqa: E402
from cbbench.engine.build import build_engine  # noqa: E402
from cbbench.engine.core.feed import run_until_done  # noqa: E402
from cbbench.engine.core.request import Request  # noqa: E402
from cbbench.engine.core.spec_decode import max_drafts  # noqa: E402

NUM_REQUESTS = 8
BASE = ["--engine", "torch", "--device", "cpu", "--dtype", "fp32", "--save-detailed",
        "--speculative-tokens", "3"]  # fmt: skip
ROOMY = ["--num-kv-blocks", "128"]
CHUNKED = ["--max-num-batched-tokens", "16"]
# Block size 4, 24 blocks (96 slots): the largest request needs ~19 blocks, the eight together
# ~150 -> preemption (recompute), with drafts scheduled and taken back.
PREEMPT = ["--block-size", "4", "--num-kv-blocks", "24"]


def _workload(seed: int) -> tuple[list[list[int]], list[int], list[float]]:
    rng = random.Random(seed)
    prompts, outs, arrivals = [], [], []
    for i in range(NUM_REQUESTS):
        segment = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(3, 7))]
        tail = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(0, 5))]
        prompts.append(segment * 3 + tail)
        outs.append(rng.randint(30, 48))
        arrivals.append(0.0 if i < 4 else 0.01 * i)
    return prompts, outs, arrivals


class Case:
    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        hf = tiny_hf_model(kind)
        self.folder = root / f"hf-{kind}"
        hf.save_pretrained(self.folder)
        self.prompts, self.outs, arrivals = _workload(seed=5)
        self.workload = root / "workload.jsonl"
        self.workload.write_text("".join(
            json.dumps({"prompt_token_ids": p, "output_len": o, "arrival_s": t}) + "\n"
            for p, o, t in zip(self.prompts, self.outs, arrivals, strict=True)
        ))  # fmt: skip
        self.expected = hf_greedy(hf, self.prompts, self.outs)

    def run(self, out: Path, *flags: str) -> dict:
        args = ["run", "--workload", str(self.workload), "--model", str(self.folder), *BASE,
                *flags, "--output", str(out)]  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        return json.loads(out.read_text())

    def check(self, result: dict) -> dict:
        reqs = {r["id"]: r for r in result["requests"]}
        for i, want in enumerate(self.expected):
            assert reqs[i]["error"] is None, reqs[i]
            got = reqs[i]["output_token_ids"]
            assert got == want, f"{self.kind} request {i}\n cbbench: {got}\n     HF: {want}"
        spec = result["summary"]["speculative"]
        # Both verification paths ran many times: accepted drafts and rejected ones.
        assert spec["drafts"] >= 20 and 0 < spec["accepted_tokens"] < spec["draft_tokens"]
        assert spec["source"] == "engine" and spec["speculative_tokens"] == 3
        its = result["iterations"]
        assert spec["draft_tokens"] == sum(it["draft_tokens"] for it in its)
        assert sum(it["emitted_tokens"] for it in its) == sum(self.outs)
        # Some step gained a request more than one token.
        assert any(it["emitted_tokens"] > it["num_sampled_reqs"] for it in its)
        return spec


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def case(request, tmp_path_factory) -> Case:
    return Case(request.param, tmp_path_factory.mktemp(f"spec-{request.param}"))


SWAP_PREFIX = ["--preemption", "swap", "--swap-space", "0.0005", "--enable-prefix-caching"]
STATIC = ["--scheduler", "static", "--max-num-seqs", "3"]


@pytest.mark.parametrize(
    "flags",
    [ROOMY, [*CHUNKED, *ROOMY], PREEMPT, [*PREEMPT, *CHUNKED], [*PREEMPT, *SWAP_PREFIX],
     [*STATIC, *ROOMY], [*PREEMPT, *CHUNKED, "--async-scheduling"]],
    ids=["roomy", "chunked", "preempt", "preempt-chunked", "swap-prefix-cache", "static",
         "async-scheduling"],
)
def test_ngram_speculation_matches_hf(case, tmp_path, flags):
    result = case.run(tmp_path / "spec.json", *flags)
    spec = case.check(result)
    its = result["iterations"]
    if "--max-num-batched-tokens" in flags:
        assert all(it["num_prefill_tokens"] + it["num_decode_tokens"] <= 16 for it in its)
        # Draft rows shared iterations with prefill chunks.
        assert any(it["draft_tokens"] > 0 and it["num_prefill_tokens"] > 0 for it in its)
    if flags[:2] == PREEMPT[:2]:
        assert sum(it["num_preempted"] for it in its) > 0, "the small pool never preempted"
    if "swap" in flags:
        assert sum(it["num_swapped_out_blocks"] for it in its) > 0
    print(f"{case.kind} {flags}: acceptance rate {spec['acceptance_rate']:.3f}, "
          f"mean acceptance length {spec['mean_acceptance_length']:.2f}")


class OracleDrafter:
    """Drafts the reference continuation, with one token corrupted at a drawn position in
    about half of the proposals: long accepted runs and rejections at every depth."""

    def __init__(self, k: int, expected: dict[int, list[int]], seed: int = 0) -> None:
        self.k, self.expected, self.rng = k, expected, random.Random(seed)

    def propose(self, req: Request) -> list[int]:
        n = max_drafts(req, self.k)
        ref = self.expected[req.request_id]
        drafts = ref[req.num_output_tokens : req.num_output_tokens + n]
        if drafts and self.rng.random() < 0.5:
            j = self.rng.randrange(len(drafts))
            drafts[j] = (drafts[j] + 1) % TINY_VOCAB
        return drafts


def test_oracle_drafts_keep_outputs_and_roll_back_across_blocks(tmp_path):
    hf = tiny_hf_model("llama")
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    prompts, outs, _ = _workload(seed=9)
    expected = hf_greedy(hf, prompts, outs)
    args = EngineArgs(engine="torch", model=str(folder), device="cpu", dtype="fp32",
                      block_size=4, num_kv_blocks=40, max_num_batched_tokens=24,
                      speculative_tokens=5)  # fmt: skip
    engine, _ = build_engine(args)
    engine.drafter = OracleDrafter(5, dict(enumerate(expected)))
    reqs = [Request(i, len(p), n, prompt_token_ids=p)
            for i, (p, n) in enumerate(zip(prompts, outs, strict=True))]  # fmt: skip
    bm = engine.block_manager
    trim = bm.trim
    freed = []

    def counting_trim(req, num_tokens):
        before = len(req.block_table)
        trim(req, num_tokens)
        freed.append(before - len(req.block_table))

    bm.trim = counting_trim
    run_until_done(engine, reqs)
    for r, want in zip(reqs, expected, strict=True):
        assert r.output_token_ids == want, r
    its = engine.records
    drafted = sum(it.draft_tokens for it in its)
    accepted = sum(it.accepted_tokens for it in its)
    assert 0.4 < accepted / drafted < 0.95  # most proposals are right up to the corruption
    assert max(it.emitted_tokens - it.num_sampled_reqs for it in its) >= 5  # 5 drafts kept
    assert sum(it.num_preempted for it in its) > 0  # 40 blocks of 4 are short for eight
    assert freed and max(freed) >= 1  # rejected drafts' blocks were freed
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks


def test_torch_engine_ignores_acceptance_rate_with_one_notice(notices):
    args = EngineArgs(engine="torch", model="tiny", device="cpu", num_kv_blocks=16,
                      speculative_tokens=2, acceptance_rate=0.5)  # fmt: skip
    engine, info = build_engine(args)
    ignored = [n for n in notices if "--acceptance-rate" in n]
    assert len(ignored) == 1 and "ignored by the torch engine" in ignored[0]
    assert "\n" not in ignored[0]
    assert info.speculative_tokens == 2 and info.acceptance_rate is None
    assert engine.drafter is not None
