"""The policies from the front: options and their validation, compare variants, the
shared-prefix workload, per-priority metrics, and simulated runs that show each policy's
effect in the result (swap traffic and time, cache hits, per-class TTFT)."""

from __future__ import annotations

import json

import pytest
from helpers import run_spec
from typer.testing import CliRunner

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.metrics import summarize
from cbbench.bench.runner import execute_run
from cbbench.bench.variants import parse_variant
from cbbench.cli import options as C
from cbbench.cli.app import app
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.workload import SHARED_PREFIX_VOCAB, load_workload
from cbbench.schema import RunResult

runner = CliRunner()


def _quiet(_msg: str) -> None:
    pass


# ---- options --------------------------------------------------------------------------------
def _opts(**kw) -> EngineArgs:
    return C.EngineArgs(engine="sim", **kw).validate()


def test_engine_options_defaults_and_validation():
    o = _opts()
    assert (o.preemption, o.swap_space, o.queue_policy, o.enable_prefix_caching) == (
        "recompute", 4.0, "fcfs", False
    )
    o = _opts(preemption="swap", swap_space=0.5, queue_policy="priority", enable_prefix_caching=True)
    assert (o.preemption, o.swap_space, o.queue_policy, o.enable_prefix_caching) == (
        "swap", 0.5, "priority", True
    )
    for bad in (dict(preemption="offload"), dict(queue_policy="lifo"), dict(swap_space=-1.0),
                dict(swap_space=float("nan"))):  # fmt: skip
        with pytest.raises(UsageError):
            _opts(**bad)


def test_run_rejects_an_unknown_policy_with_usage_exit():
    r = runner.invoke(app, ["run", "--engine", "sim", "--policy", "lifo", "--num-requests", "5"])
    assert r.exit_code == 2 and "fcfs, priority" in r.stderr


def test_compare_variants_combine_the_policy_axes():
    v = parse_variant("swap+priority+prefix-cache")
    assert (v.preemption, v.queue_policy, v.enable_prefix_caching) == ("swap", "priority", True)
    assert v.batching is None and v.kv_allocation is None
    v = parse_variant("continuous-chunked+recompute+fcfs+no-prefix-cache+reserved")
    assert (v.batching, v.kv_allocation, v.preemption, v.queue_policy, v.enable_prefix_caching) == (
        "continuous", "reserved", "recompute", "fcfs", False
    )
    base = EngineArgs(engine="sim", preemption="swap", swap_space=1.0, num_kv_blocks=100)
    opts = parse_variant("priority").apply(base)
    assert (opts.preemption, opts.swap_space, opts.queue_policy) == ("swap", 1.0, "priority")
    assert parse_variant("prefix-cache").apply(base).enable_prefix_caching
    for bad in ("swap+recompute", "fcfs+priority", "prefix-cache+no-prefix-cache", "lru"):
        with pytest.raises(UsageError):
            parse_variant(bad)


# ---- the shared-prefix workload -------------------------------------------------------------
def test_shared_prefix_workload():
    w = load_workload("shared-prefix")
    assert len(w.requests) == 1000
    assert w.requests == load_workload("shared-prefix").requests  # fixed seed
    groups = [w.requests[i : i + 50] for i in range(0, 1000, 50)]
    for g in groups:
        first = g[0].prompt_token_ids
        # The longest prefix shared by the whole group is its system prompt: 1,000-2,000.
        n = 0
        while all(len(r.prompt_token_ids) > n and r.prompt_token_ids[n] == first[n] for r in g):
            n += 1
        assert n >= 1000  # (a few more when the suffixes happen to start alike)
        for r in g:
            assert 1000 + 50 <= r.prompt_len <= 2000 + 300 and r.prompt_len - n <= 300
            assert 50 <= r.output_len <= 300
            assert r.prompt_len == len(r.prompt_token_ids)
            assert max(r.prompt_token_ids) < SHARED_PREFIX_VOCAB <= 512
    assert len({g[0].prompt_token_ids[:100] for g in groups}) == 20


# ---- per-priority metrics -------------------------------------------------------------------
def _rec(i: int, priority: int, ttft: float, n: int = 3) -> RequestRecord:
    return RequestRecord(
        id=i, prompt_tokens=4, output_tokens=n, intended_start_s=0.0,
        token_times_s=[ttft + 0.01 * k for k in range(n)], priority=priority,
    )  # fmt: skip


def test_per_priority_breakdown():
    recs = [_rec(0, 0, 0.1), _rec(1, 0, 0.3), _rec(2, 1, 2.0), _rec(3, 1, 4.0, n=1)]
    recs.append(RequestRecord(id=4, prompt_tokens=4, output_tokens=0, intended_start_s=0.0,
                              error="rejected", error_type="rejected", priority=1))  # fmt: skip
    s = summarize(recs, 5.0)
    pp = s["per_priority"]
    assert set(pp) == {"0", "1"}
    assert pp["0"]["completed"] == 2 and pp["0"]["failed"] == 0
    assert pp["0"]["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert pp["0"]["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert pp["0"]["ttft_ms"]["p99"] == pytest.approx(100 + 200 * 0.99)
    assert pp["0"]["tpot_ms"]["mean"] == pytest.approx(10.0)
    assert pp["1"]["completed"] == 2 and pp["1"]["failed"] == 1
    assert pp["1"]["ttft_ms"]["mean"] == pytest.approx(3000.0)
    assert pp["1"]["tpot_ms"]["p50"] == pytest.approx(10.0)  # the 1-token request has none
    assert set(pp["0"]["ttft_ms"]) == {"mean", "p50", "p99"}
    json.dumps(s)
    # One priority class: no breakdown.
    assert "per_priority" not in summarize([_rec(0, 0, 0.1), _rec(1, 0, 0.2)], 1.0)


# ---- simulated runs -------------------------------------------------------------------------
def _sim(workload="sharegpt", n=300, rate=float("inf"), **engine) -> RunResult:
    spec = run_spec(
        workload=workload, num_requests=n, seed=0, request_rate=rate,
        engine=EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", **engine),
    )  # fmt: skip
    return execute_run(spec)


def test_sim_swap_reports_traffic_and_time():
    tight = dict(num_kv_blocks=800)
    rec = _sim(**tight)
    swap = _sim(preemption="swap", **tight)
    er, es = rec.summary.engine, swap.summary.engine
    assert er.num_preemptions > 0 and er.num_swapped_out_blocks == 0
    assert es.num_preemptions > 0
    assert es.num_swapped_out_blocks == es.num_swapped_in_blocks > 0
    # 2 MiB a block over the H200's 50 GB/s host link, in 32 layers x 2 (K, V) copies.
    per_block = 64 * 9e-6 + 16 * 131_072 / 50e9
    total = es.num_swapped_out_blocks + es.num_swapped_in_blocks
    assert es.swap_time_s == pytest.approx(total * per_block)
    assert swap.config.num_cpu_blocks == int(4 * 1024**3 // (16 * 131_072)) == 2048
    assert rec.summary.completed == swap.summary.completed == 300
    # Swapped requests resume without recomputing: less prefill work in all.
    assert es.total_prefill_tokens < er.total_prefill_tokens
    its = swap.iterations
    assert sum(it.num_swapped_out_blocks for it in its) == es.num_swapped_out_blocks


def test_sim_swap_space_is_per_gpu_under_tensor_parallelism():
    # vLLM V0: --swap-space is GiB per GPU, divided by one GPU's cache block (its KV heads,
    # 8 / 2 = 4 of Llama-3-8B's under TP 2): 4 GiB // (16 x 65,536 B) = 4,096 CPU blocks, not
    # the 2,048 a whole-model block gives. The swap time is per GPU's shard too, each GPU over
    # its own host link.
    swap = _sim(n=60, preemption="swap", tensor_parallel_size=2, num_kv_blocks=200)
    assert swap.config.num_cpu_blocks == 4 * 1024**3 // (16 * 65_536) == 4096
    es = swap.summary.engine
    assert es.num_swapped_out_blocks > 0
    total = es.num_swapped_out_blocks + es.num_swapped_in_blocks
    assert es.swap_time_s == pytest.approx(total * (64 * 9e-6 + 16 * 65_536 / 50e9))


def test_sim_prefix_caching_on_shared_prefix():
    off = _sim("shared-prefix", n=200, rate=10.0)
    on = _sim("shared-prefix", n=200, rate=10.0, enable_prefix_caching=True)
    eoff, eon = off.summary.engine, on.summary.engine
    assert eoff.prefix_cache_hit_tokens == 0 and eoff.prefix_cache_hit_rate is None
    assert eon.prefix_cache_hit_rate > 0.5
    saved = eoff.total_prefill_tokens - eon.total_prefill_tokens
    assert saved == eon.prefix_cache_hit_tokens
    assert on.summary.ttft_ms.mean < off.summary.ttft_ms.mean
    # Length-only workloads carry no ids: caching finds nothing, and says so.
    plain = _sim(n=50, enable_prefix_caching=True)
    assert plain.summary.engine.prefix_cache_hit_tokens == 0


def test_sim_priority_protects_the_high_class(tmp_path):
    from cbbench.load.workload import load_workload as lw

    pool = lw("sharegpt").requests[:400]
    path = tmp_path / "two.jsonl"
    path.write_text("".join(
        json.dumps({"prompt_len": r.prompt_len, "output_len": r.output_len,
                    "priority": 0 if i % 5 == 0 else 1}) + "\n"
        for i, r in enumerate(pool)
    ))  # fmt: skip
    kw = dict(n=None, rate=float("inf"), num_kv_blocks=1500)
    fcfs = _sim(str(path), **kw)
    prio = _sim(str(path), queue_policy="priority", **kw)
    f, p = fcfs.summary.per_priority, prio.summary.per_priority
    assert f["0"]["completed"] == p["0"]["completed"] == 80
    assert p["0"]["ttft_ms"]["mean"] < f["0"]["ttft_ms"]["mean"] / 3
    assert p["1"]["ttft_ms"]["mean"] > f["1"]["ttft_ms"]["mean"]
