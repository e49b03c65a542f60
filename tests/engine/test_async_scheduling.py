"""Async scheduling (issue 29 item 7): step n+1's inputs prepared while step n runs give the
same tokens and the same iteration records as the normal path, on the CPU's torch engine, over
a run that mixes what breaks a prediction (admissions, prefill chunks, length and EOS finishes,
preemptions, new KV blocks) with long stretches where it holds. Both paths must be taken."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cbbench.engine.args import EngineArgs
from cbbench.engine.build import build_engine
from cbbench.engine.core.feed import run_until_done
from cbbench.engine.core.request import Request, SamplingParams

TIMING_FIELDS = {"start_s", "duration_s"}  # wall-clock: differ run to run either way
# (prompt, max tokens, arrival) for 12 requests: staggered arrivals, so admissions land in the
# middle of decode stretches; one long prompt is chunked.
SHAPES = [(5, 40, 0.0), (17, 9, 0.0), (33, 60, 0.0), (3, 25, 0.0), (90, 12, 0.0), (8, 33, 0.0),
          (41, 3, 0.0), (12, 50, 0.0), (6, 17, 0.0), (29, 44, 0.0), (70, 21, 0.0), (2, 30, 0.0)]  # fmt: skip


def _requests(eos: dict[int, int]) -> list[Request]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i, (n, m, t) in enumerate(SHAPES):
        ids = torch.randint(0, 512, (n,), generator=g).tolist()
        sampling = SamplingParams(ignore_eos=i not in eos)
        out.append(Request(i, n, m, arrival_time=t, prompt_token_ids=ids, sampling=sampling,
                           eos_token_ids=(eos[i],) if i in eos else ()))  # fmt: skip
    return out


def _run(async_scheduling: bool, eos: dict[int, int], num_kv_blocks: int):
    args = EngineArgs(engine="torch", device="cpu", model="tiny", max_num_seqs=6,
                      max_num_batched_tokens=48, num_kv_blocks=num_kv_blocks, block_size=4,
                      async_scheduling=async_scheduling)  # fmt: skip
    engine, _ = build_engine(args)
    reqs = _requests(eos)
    assert run_until_done(engine, reqs)
    records = [
        {k: v for k, v in dataclasses.asdict(r).items() if k not in TIMING_FIELDS}
        for r in engine.records
    ]
    runner = engine.executor.runner if hasattr(engine.executor, "runner") else engine.executor
    return reqs, records, runner


@pytest.fixture(scope="module")
def eos() -> dict[int, int]:
    """Stop tokens that really occur: request 0 stops at its 7th greedy token, request 5 at its
    12th (taken from a run without stops), so EOS finishes break predictions mid-stretch."""
    reqs, _, _ = _run(False, {}, 400)
    return {0: reqs[0].output_token_ids[6], 5: reqs[5].output_token_ids[11]}


@pytest.mark.parametrize("num_kv_blocks", [400, 40], ids=["roomy", "preempting"])
def test_async_scheduling_gives_the_same_tokens_and_records(eos, num_kv_blocks):
    base, base_records, base_runner = _run(False, eos, num_kv_blocks)
    got, got_records, runner = _run(True, eos, num_kv_blocks)
    assert [r.output_token_ids for r in got] == [r.output_token_ids for r in base]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in base]
    assert got_records == base_records
    # The run exercised both paths: predicted inputs used, and misses rebuilt normally.
    assert runner.async_scheduling and not base_runner.async_scheduling
    assert runner.async_hits > 0 and runner.async_misses > 0, (runner.async_hits, runner.async_misses)
    assert base_runner.async_hits == 0
    assert any(r.finish_reason == "stop" for r in got)
    if num_kv_blocks == 40:
        assert sum(r["num_preempted"] for r in got_records) > 0
