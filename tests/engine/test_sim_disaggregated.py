"""Disaggregated prefill and decode: the first token from the prefill instance, the KV over
the link (latency + bytes / bandwidth, one transfer at a time per prefill link), the rest
from the decode instance.

Truth: a single request's timeline, computed by hand from the cost model's step times (the
prefill instance's prefill iterations, the link's formula, the decode instance's decode
steps), and the engines' own records.
"""

from __future__ import annotations

import pytest
from helpers import cli_in_process

from cbbench.engine.args import EngineArgs
from cbbench.engine.build import build_replicas
from cbbench.engine.core.feed import ListFeed
from cbbench.engine.core.request import Request, RequestStatus
from cbbench.engine.sim.cost_model import BatchShape
from cbbench.engine.sim.kv_link import KV_LINKS, get_kv_link
from cbbench.engine.sim.replicas import run_replicas

KV_LLAMA3_8B = 131072  # bytes per token: 2 x 32 layers x 8 KV heads x 128 x 2


def _set(pd="1:1", link="nvlink", model="llama-3-8b", **kw):
    args = EngineArgs(engine="sim", gpu="h100", model=model, disaggregate=pd,
                      kv_link=link, **kw)
    return build_replicas(args)[0]


def _run(pd_set, reqs):
    assert run_replicas(pd_set, ListFeed(reqs))
    return pd_set


def test_one_request_timeline_by_hand():
    """A 1,000-token prompt, 4 output tokens, alone on 1:1 over InfiniBand."""
    s = _set(link="infiniband")
    req = Request(0, 1000, 4, arrival_time=0.5)
    _run(s, [req])
    cm = s.prefill[0].engine.cost_model
    # The prefill instance: one iteration of the whole prompt (budget 2048), its first token.
    prefill = cm.cost(BatchShape(1000, 1, 1000 * 1001 / 2, 1000, 1, 1, 0.0)).time_s
    t1 = 0.5 + prefill
    assert req.token_times[0] == pytest.approx(t1, rel=1e-12)
    # The link: 5 us + 1,000 x 131,072 bytes at 50 GB/s (2.62 ms).
    transfer = 5e-6 + 1000 * KV_LLAMA3_8B / 50e9
    assert s.kv_transfer_ms == [pytest.approx(transfer * 1e3, rel=1e-12)]
    # The decode instance: three decode steps, with 1000, 1001, 1002 tokens of context.
    t = t1 + transfer
    for i, c in enumerate((1000, 1001, 1002)):
        t += cm.cost(BatchShape(1, 1, c + 1, c + 1, 1, 0, c + 1)).time_s
        assert req.token_times[i + 1] == pytest.approx(t, rel=1e-12)
    assert req.status == RequestStatus.FINISHED and req.num_output_tokens == 4
    assert req.max_tokens == 4
    pre = [r for r in s.records if r.pool == "prefill"]
    dec = [r for r in s.records if r.pool == "decode"]
    assert len(pre) == 1 and pre[0].num_prefill_tokens == 1000 and pre[0].num_decode_tokens == 0
    assert len(dec) == 3 and all(r.num_prefill_tokens == 0 and r.num_decode_tokens == 1
                                 for r in dec)
    assert all(e.block_manager.num_used_blocks == 0 for e in s.engines)


def test_one_link_carries_one_transfer_at_a_time():
    """Two prompts prefilled in one iteration of the same instance: the second KV waits for
    the first on the link (PCIe: 10 us + bytes / 64 GB/s each)."""
    s = _set(link="pcie")
    a, b = Request(0, 800, 3), Request(1, 600, 3)
    _run(s, [a, b])
    one = 10e-6 + 800 * KV_LLAMA3_8B / 64e9
    two = 10e-6 + 600 * KV_LLAMA3_8B / 64e9
    assert a.token_times[0] == b.token_times[0]  # one prefill iteration
    assert s.kv_transfer_ms == [pytest.approx(one * 1e3), pytest.approx((one + two) * 1e3)]


def test_pools_and_routing_on_2_3():
    """2:3: every request prefills on a prefill instance, decodes on a decode instance (round
    robin over each pool), and the prefill pool never runs a decode row."""
    s = _set("2:3")
    reqs = [Request(i, 300 + 10 * i, 20, arrival_time=0.01 * i) for i in range(12)]
    _run(s, reqs)
    assert all(r.status == RequestStatus.FINISHED and r.num_output_tokens == 20 for r in reqs)
    assert len(s.kv_transfer_ms) == 12
    pools = {(r.pool, r.replica) for r in s.records}
    assert pools == {("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1),
                     ("decode", 2)}
    assert all(r.num_decode_tokens == 0 for r in s.records if r.pool == "prefill")
    # A decode instance decodes only (no preemption here): its tokens are 1 per row.
    assert all(r.num_prefill_tokens == 0 for r in s.records if r.pool == "decode")
    assert sum(r.num_decode_tokens for r in s.records) == 12 * 19
    # Each instance's own timeline runs forward.
    for e in s.engines:
        ends = [r.start_s + r.duration_s for r in e.records]
        assert ends == sorted(ends)


def test_one_token_outputs_never_leave_the_prefill_instance():
    s = _set()
    req = Request(0, 100, 1)
    _run(s, [req])
    assert req.status == RequestStatus.FINISHED and s.kv_transfer_ms == []
    assert all(r.pool == "prefill" for r in s.records)


def test_summary_has_transfer_distribution_and_goodput_per_gpu():
    from helpers import run_spec

    from cbbench.bench.runner import execute_run

    spec = run_spec(workload="long-prompt", num_requests=30, request_rate=2.0,
                   slo={"ttft": 2000.0, "tpot": 50.0},
                   engine=EngineArgs(engine="sim", gpu="h100", disaggregate="1:1",
                                     tensor_parallel_size=2))
    result = execute_run(spec)
    s = result.summary
    assert s.gpus == 4 and s.kv_transfer_ms.count == 30
    assert s.goodput_per_gpu == pytest.approx(s.goodput / 4)
    # Two GPUs per instance: each sends half the KV over its own NVLink.
    lens = [r.prompt_tokens for r in result.requests]
    floor = min(10e-6 + n * KV_LLAMA3_8B / (2 * 450e9) for n in lens) * 1e3
    assert s.kv_transfer_ms.p50 >= floor
    assert {it.pool for it in result.iterations} == {"prefill", "decode"}
    assert set(s.engine.pools) == {"prefill", "decode"}


def test_links_are_stated():
    assert set(KV_LINKS) == {"nvlink", "pcie", "infiniband", "roce"}
    assert get_kv_link("InfiniBand").bandwidth == 50e9


@pytest.mark.parametrize("flags, words", [
    (["--disaggregate", "0:1"], ["--disaggregate 0:1", "at least one"]),
    (["--disaggregate", "2"], ["P:D"]),
    (["--disaggregate", "1:1", "--kv-link", "carrier-pigeon"], ["carrier-pigeon", "nvlink"]),
])
def test_bad_input_is_one_line_exit_2(tmp_path, flags, words):
    out = tmp_path / "r.json"
    # The console script's entry in this process (its exit status and stderr as a process's):
    # the one-line refusal is the point, not a second interpreter's start-up.
    proc = cli_in_process(["run", "--engine", "sim", "--num-requests", "2", *flags,
                           "--output", str(out)])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("tp,links", [(4, 4), (8, 8), (16, 8)])
def test_replicated_kv_heads_do_not_share_the_transfer(tp, links):
    """Llama-3-8B has 8 KV heads: at tensor parallel 16 each head sits on two GPUs, so 8 GPUs
    hold distinct KV and a request's transfer crosses 8 links, not 16 (it was 16: half the
    time). 1,000 prompt tokens alone over InfiniBand: 5 us + 1,000 x 131,072 B / (links x
    50 GB/s)."""
    s = _set(link="infiniband", tensor_parallel_size=tp)
    _run(s, [Request(0, 1000, 4, arrival_time=0.5)])
    transfer = 5e-6 + 1000 * KV_LLAMA3_8B / (links * 50e9)
    assert s.kv_transfer_ms == [pytest.approx(transfer * 1e3, rel=1e-12)]
    assert s.num_gpus == 2 * tp


def test_expert_parallel_sends_a_request_over_one_link():
    """Expert parallelism keeps attention data-parallel: a request's KV sits whole on one GPU
    (docs/simulator-cluster.md), so it crosses that GPU's one link, not ep links (it was ep:
    a quarter of the time at ep 4); the ep GPUs send their own requests side by side.
    Qwen3-30B-A3B: 2 x 48 layers x 4 KV heads x 128 x 2 = 98,304 bytes per token."""
    s = _set(link="infiniband", model="qwen3-30b-a3b", expert_parallel_size=4)
    a, b = Request(0, 1000, 4), Request(1, 1000, 4)
    _run(s, [a, b])
    one = 5e-6 + 1000 * 98304 / 50e9
    assert a.token_times[0] == b.token_times[0]  # one prefill iteration, two lanes free
    assert s.kv_transfer_ms == [pytest.approx(one * 1e3, rel=1e-12)] * 2


def test_prefill_instance_holds_the_kv_until_it_has_left():
    """The prefill instance's blocks stay the request's until its KV has crossed the link (the
    link reads them: vLLM's NIXL connector frees them on the decode side's notification);
    they were freed at the end of the prefill. A 1,000-token prompt (63 blocks of 16) over
    PCIe, 2.06 ms; a 16-token one arriving 1 ms after its prefill sees the 63 blocks held,
    one arriving 50 ms later only its own, and nothing is held once every KV has left."""
    s = _set(link="pcie")
    a = Request(0, 1000, 3)
    _run(s, [a])
    t1 = a.token_times[0]
    b = Request(1, 16, 3, arrival_time=t1 + 1e-3)
    c = Request(2, 16, 3, arrival_time=t1 + 50e-3)  # after both KVs have left
    s = _set(link="pcie")
    a = Request(0, 1000, 3)
    _run(s, [a, b, c])
    pre = [r for r in s.records if r.pool == "prefill"]
    assert [r.kv_blocks_used for r in pre] == [63, 63 + 1, 1]
    assert all(e.block_manager.num_used_blocks == 0 for e in s.engines)
