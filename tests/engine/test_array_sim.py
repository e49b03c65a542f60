"""The array simulator (engine/sim/array_sim.py) against the object path it replaces at scale.

Truth: the object engines (Engine + Scheduler + SimExecutor, stepped by run_feed or
run_replicas) on the same requests. Every request's token times, admission time, output count
and error, every iteration record field, the run's duration and the KV left at the end must be
identical (==, not close): the array simulator claims the same run, computed another way.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from cbbench.engine.args import EngineArgs
from cbbench.engine.model_config import get_model_config
from cbbench.engine.sim.array_sim import NeedsStepping, unsupported
from cbbench.engine.sim.cost_model import BatchShape, CostModel
from cbbench.engine.sim.gpu_specs import get_gpu_spec
from cbbench.load.arrivals import arrival_times
from cbbench.load.workload import load_workload, sample_requests
from cbbench.targets.engine import run_engine
from cbbench.targets.engine_compact import run_engine_compact


def _requests(n: int, rate: float, seed: int = 0):
    reqs, _ = sample_requests(load_workload("sharegpt"), n, seed)
    return reqs, arrival_times(reqs, rate, 1.0, "poisson", seed, None)


def _args(**kw) -> EngineArgs:
    return EngineArgs(**{"engine": "sim", "gpu": "h200", "model": "llama-3-8b", **kw})


def assert_same_run(opts: EngineArgs, reqs, arrivals) -> None:
    ref = run_engine(opts, reqs, arrivals)
    run = run_engine_compact(opts, reqs, arrivals)
    assert run is not None
    r = run.requests
    assert len(r) == len(ref.records)
    for i, rec in enumerate(ref.records):
        assert rec.id == r.id[i] and rec.prompt_tokens == r.prompt_tokens[i]
        assert rec.token_times_s == r.token_times(i, run.replica_end_s).tolist(), rec.id
        assert rec.output_tokens == r.output_tokens[i]
        assert rec.max_tokens == r.max_tokens[i] and rec.intended_start_s == r.arrival_s[i]
        if rec.first_scheduled_s is None:
            assert np.isnan(r.first_scheduled_s[i])
        else:
            assert rec.first_scheduled_s == r.first_scheduled_s[i]
        assert (rec.error, rec.error_type) == r.errors.get(i, (None, None))
    steps = list(run.steps.dicts())
    assert len(steps) == len(ref.iterations)
    for a, b in zip(ref.iterations, steps):
        assert a == b
        assert [type(v) for v in a.values()] == [type(b[k]) for k in a]  # ints stay ints
    assert run.duration_s == ref.duration_s
    assert run.kv_blocks_in_use_at_end == ref.kv_blocks_in_use_at_end == 0
    assert run.not_sent == ref.not_sent and not run.interrupted


@pytest.mark.parametrize("kw", [
    {},
    {"data_parallel_size": 8},
    {"data_parallel_size": 4, "router": "least-requests"},
    {"data_parallel_size": 4, "router": "least-kv"},
    {"max_num_batched_tokens": 300, "max_num_seqs": 64},  # prompts split across steps
    {"chunked_prefill": False, "max_model_len": 1024},
    {"gpu": "h100", "tensor_parallel_size": 2},
    {"gpu": "h100", "model": "mixtral-8x7b", "tensor_parallel_size": 2},  # CostModel.cost
], ids=["dp1", "dp8", "least-requests", "least-kv", "chunks", "unchunked", "tp2", "moe"])
def test_array_sim_is_the_object_run(kw):
    dp = kw.get("data_parallel_size", 1)
    reqs, arrivals = _requests(400 * dp, 50.0 * dp)
    assert_same_run(_args(**kw), reqs, arrivals)


def test_rejections_and_one_token_requests_match():
    """Requests too long for the context are rejected at arrival with the scheduler's own
    words; a one-token request finishes in its prefill step."""
    reqs, arrivals = _requests(500, 40.0, seed=3)
    reqs[5:7] = [dataclasses.replace(w, output_len=1) for w in reqs[5:7]]
    opts = _args(max_model_len=700, max_num_batched_tokens=200, max_num_seqs=32)
    run = run_engine_compact(opts, reqs, arrivals)
    assert run is not None and run.requests.errors  # some were rejected
    assert all(kind == "rejected" for _, kind in run.requests.errors.values())
    assert_same_run(opts, reqs, arrivals)


def test_a_preemption_hands_the_run_back():
    """A KV pool too small for the load: the object path preempts, the array simulator stops
    and says so (the caller steps the objects)."""
    reqs, arrivals = _requests(300, 50.0)
    assert run_engine_compact(_args(num_kv_blocks=200), reqs, arrivals) is None
    stepped = run_engine(_args(num_kv_blocks=200), reqs, arrivals)  # one run read twice
    assert stepped.iterations  # it does run
    assert sum(it["num_preempted"] for it in stepped.iterations) > 0


def test_what_it_does_not_model_is_named():
    assert unsupported(_args()) is None
    assert unsupported(_args(fast_forward=False)) == "--no-fast-forward steps every request"
    assert unsupported(_args(enable_prefix_caching=True)) == "prefix caching"
    assert unsupported(_args(speculative_tokens=3)) == "speculative decoding"
    assert unsupported(_args(batching="static")) == "static batching"
    with pytest.raises(NeedsStepping):  # decodes could run out of budget
        reqs, arrivals = _requests(10, 5.0)
        from cbbench.engine.build import build_engine
        from cbbench.engine.sim.array_sim import _Replica

        _Replica(0, build_engine(_args(max_num_seqs=256, max_num_batched_tokens=256))[0])


@pytest.mark.parametrize("model,gpu,tp", [("llama-3-8b", "h200", 1), ("llama-3.1-70b", "h100", 4),
                                          ("qwen2.5-7b", "a100-80gb", 1)])
def test_the_flat_roofline_is_the_operator_sum_bit_for_bit(model, gpu, tp):
    cm = CostModel(get_model_config(model), gpu=get_gpu_spec(gpu), tensor_parallel_size=tp)
    fast = cm.flat
    assert fast is not None
    rng = random.Random(0)
    for _ in range(2000):
        nd = rng.randint(0, 256)
        dec_keys = nd * rng.randint(1, 4000) + nd
        prefills = [(rng.randint(1, 2048), rng.randint(0, 8000)) for _ in range(rng.randint(0, 3))]
        if nd == 0 and not prefills:
            continue
        pairs = keys = float(dec_keys)
        logits = nd
        for n, c in prefills:
            pairs += n * c + n * (n + 1) / 2
            keys += c + n
            logits += rng.random() < 0.5
        tokens = nd + sum(n for n, _ in prefills)
        shape = BatchShape(tokens, logits, pairs, keys, nd + len(prefills), len(prefills),
                           float(dec_keys))
        want = cm.roofline(shape)
        assert fast(tokens, logits, pairs, keys, nd + len(prefills), len(prefills),
                    float(dec_keys)) == (want.time_s, want.bytes, want.flops)


@pytest.mark.parametrize("grace_s", [60.0, 0.0])
def test_an_interrupt_keeps_what_finished(monkeypatch, grace_s):
    """A stop mid-run: arrivals not yet fired are not sent, queued requests are aborted, the
    running ones finish within the grace (0: they are aborted with the tokens they had), and
    every KV block comes back."""
    import cbbench.engine.sim.array_sim as array_sim

    monkeypatch.setattr(array_sim, "CHECK_EVERY_STEPS", 50)
    reqs, arrivals = _requests(600, 200.0)
    checks = []

    def stop() -> bool:
        checks.append(1)
        return len(checks) >= 4  # after 200 steps

    run = run_engine_compact(_args(max_num_seqs=8), reqs, arrivals, should_stop=stop,
                             grace_s=grace_s)
    assert run is not None and run.interrupted
    r = run.requests
    assert 0 < len(r) < 600 and run.not_sent == 600 - len(r)
    kinds = [r.errors.get(i, (None, None))[1] for i in range(len(r))]
    done = [i for i, k in enumerate(kinds) if k is None]
    aborted = [i for i, k in enumerate(kinds) if k == "interrupted"]
    assert done and aborted and len(done) + len(aborted) == len(r)
    for i in done:  # whole, on consecutive steps of its replica
        assert r.output_tokens[i] == r.max_tokens[i]
        assert len(r.token_times(i, run.replica_end_s)) == r.max_tokens[i]
    partial = [i for i in aborted if r.output_tokens[i] > 0]
    if grace_s:  # the running ones finished: an aborted request never started
        assert partial == [] and all(np.isnan(r.first_scheduled_s[i]) for i in aborted)
    else:  # 8 were running at the stop: cut mid-decode, their tokens kept
        assert 0 < len(partial) <= 8
        assert all(r.output_tokens[i] < r.max_tokens[i] for i in partial)
    assert run.kv_blocks_in_use_at_end == 0
    assert run.duration_s == max(float(e[-1]) for e in run.replica_end_s if len(e))


@pytest.mark.parametrize("kw", [{"data_parallel_size": 2}, {"disaggregate": "1:1"}])
def test_the_object_paths_drain_labels_its_steps(kw):
    """An interrupted multi-engine run drains each engine on its own: those steps carry their
    replica (and pool) like every other, so the set's (start, replica) order holds. Before,
    they had none (a TypeError when two start times tied)."""
    reqs, arrivals = _requests(400, 200.0)
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 300

    run = run_engine(_args(**kw), reqs, arrivals, should_stop=stop)
    assert run.interrupted
    assert all(it["replica"] is not None for it in run.iterations)
    if "disaggregate" in kw:
        assert {it["pool"] for it in run.iterations} == {"prefill", "decode"}
    starts = [(it["start_s"], it.get("pool") or "", it["replica"]) for it in run.iterations]
    assert len(starts) == len(set(starts))


@pytest.mark.parametrize("kw", [{}, {"tensor_parallel_size": 2}, {"model": "mixtral-8x7b"}])
def test_every_price_of_a_simulated_run_is_the_operator_sum(monkeypatch, kw):
    """CostModel.cost prices a simulated run's steps (stepped and fast-forwarded) through the
    flat roofline: every price is the operator-by-operator sum's, bit for bit and of the same
    types (a record writes an int byte count as '1', a float as '1.0'); a MoE model is
    priced operator by operator."""
    cost = CostModel.cost
    seen = {"steps": 0, "flat": 0}

    def checked(self, shape):
        got, want = cost(self, shape), self.roofline(shape)
        assert got == want
        assert [type(v) for v in (got.bytes, got.flops, got.time_s)] == \
            [type(v) for v in (want.bytes, want.flops, want.time_s)]
        seen["steps"] += 1
        seen["flat"] += self.flat is not None and type(shape.attn_keys_read) is float
        return got

    monkeypatch.setattr(CostModel, "cost", checked)
    reqs, arrivals = _requests(200, 20.0)
    run_engine(_args(**kw), reqs, arrivals)
    assert seen["steps"] > 200
    assert seen["flat"] == (0 if "model" in kw else seen["steps"])
