"""--workload random: vLLM's random-dataset lengths, a shared prefix, and the flags' checks."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke_app, run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.synthetic import RandomSpec, random_workload


def _lens(w):
    return np.array([r.prompt_len for r in w.requests]), np.array([r.output_len for r in w.requests])


def test_range_zero_gives_exact_lengths():
    w = random_workload(RandomSpec(input_len=300, output_len=40), 50, seed=0)
    p, o = _lens(w)
    assert (p == 300).all() and (o == 40).all()
    assert all(r.prompt_token_ids is None for r in w.requests)  # length-only without a prefix


def test_range_is_vllm_s_uniform_interval():
    spec = RandomSpec(input_len=10, output_len=7, length_range=0.5)
    # [floor(10 * 0.5), ceil(10 * 1.5)] = [5, 15]; [floor(3.5), ceil(10.5)] = [3, 11]
    assert spec.input_bounds() == (5, 15) and spec.output_bounds() == (3, 11)
    p, o = _lens(random_workload(spec, 5000, seed=3))
    assert (p.min(), p.max(), o.min(), o.max()) == (5, 15, 3, 11)
    assert p.mean() == pytest.approx(10, abs=0.2) and o.mean() == pytest.approx(7, abs=0.2)
    # Uniform: every value in the interval is drawn about equally often.
    counts = np.bincount(p)[5:16]
    assert counts.min() > 0.7 * counts.mean()


def test_output_length_never_below_one():
    spec = RandomSpec(input_len=1, output_len=1, length_range=0.9)
    p, o = _lens(random_workload(spec, 500, seed=0))
    assert p.min() >= 1 and o.min() >= 1 and o.max() == math.ceil(1.9)


def test_prefix_is_shared_and_lengths_do_not_move():
    base = random_workload(RandomSpec(input_len=64, length_range=0.25), 20, seed=5)
    w = random_workload(RandomSpec(input_len=64, length_range=0.25, prefix_len=32), 20, seed=5)
    prefix = w.requests[0].prompt_token_ids[:32]
    for a, b in zip(base.requests, w.requests):
        assert b.prompt_len == 32 + a.prompt_len and b.output_len == a.output_len
        assert len(b.prompt_token_ids) == b.prompt_len and b.prompt_token_ids[:32] == prefix
    assert w.requests[0].prompt_token_ids[32:] != w.requests[1].prompt_token_ids[32:]


def test_seeded():
    spec = RandomSpec(input_len=100, length_range=0.5, prefix_len=8)
    a = random_workload(spec, 30, seed=1)
    assert a.requests == random_workload(spec, 30, seed=1).requests
    assert _lens(a)[0].tolist() != _lens(random_workload(spec, 30, seed=2))[0].tolist()


@pytest.mark.parametrize("kwargs", [
    {"length_range": 1.0}, {"length_range": -0.1}, {"input_len": 0}, {"output_len": 0},
    {"prefix_len": -1},
])
def test_bad_values(kwargs):
    with pytest.raises(UsageError):
        RandomSpec(**kwargs).validate()


def test_run_records_the_parameters_and_the_prefix_hits():
    spec = run_spec(
        workload="random", num_requests=40, request_rate=5.0,
        input_len=200, output_len=20, length_range=0.1, prefix_len=256,
        engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b",
                          enable_prefix_caching=True),
    )
    result = execute_run(spec)
    assert result.config.random == {
        "input_len": 200, "output_len": 20, "length_range": 0.1, "prefix_len": 256,
    }
    assert result.summary.completed == 40
    assert all(256 + 180 <= r.prompt_tokens <= 256 + 220 for r in result.requests)
    # Spaced arrivals: every request after the first finds the 256-token prefix cached.
    assert result.summary.engine.prefix_cache_hit_tokens == 39 * 256


def test_flags_need_the_random_workload(tmp_path: Path):
    res = invoke_app(["run", "--engine", "sim", "--output-len", "5",
                      "--output", str(tmp_path / "x.json")])
    assert res.exit_code == 2
    assert res.output.strip() == "cbbench: error: --output-len applies only to --workload random"
    res = invoke_app(["run", "--engine", "sim", "--workload", "random",
                      "--length-range", "1", "--output", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "--length-range must be in [0, 1)" in res.output
