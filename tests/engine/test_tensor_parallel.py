"""Tensor parallelism in the simulator against figures computed by hand (llama-3.1-70b, bf16,
H100 SXM: 3.35 TB/s HBM, NVLink 4 at 450 GB/s per direction, 10 µs per collective)."""

from __future__ import annotations

import pytest
from helpers import run_spec
from typer.testing import CliRunner

from cbbench.bench.runner import execute_run
from cbbench.cli.app import app
from cbbench.engine.args import EngineArgs
from cbbench.engine.model_config import get_model_config
from cbbench.engine.sim.cost_model import BatchShape, CostModel, Interconnect
from cbbench.engine.sim.gpu_specs import get_gpu_spec
from cbbench.engine.sim.sim_executor import sim_num_kv_blocks

L70 = get_model_config("llama-3.1-70b")
H100 = get_gpu_spec("h100")
# Per layer: qkv 8192 x (8192 + 2 x 1024), o 8192 x 8192, gate_up 8192 x 2 x 28672,
# down 28672 x 8192; the LM head 128256 x 8192 (decode reads every weight but the embedding).
LINEAR_PER_LAYER = 8192 * 10240 + 8192 * 8192 + 8192 * 57344 + 28672 * 8192
LM_HEAD = 128256 * 8192
DECODE_WEIGHT_BYTES = 2 * (80 * LINEAR_PER_LAYER + LM_HEAD)
EFFECTIVE_BW = 3.35e12 * 0.80  # the default eta_memory
OVERHEAD_S = 300e-6
CONTEXT = 512  # keys the one decode row attends


def decode_1(tp: int) -> float:
    cm = CostModel(L70, "bf16", H100, tensor_parallel_size=tp)
    return cm.cost(BatchShape(1, 1, CONTEXT, CONTEXT, 1)).time_s


def comm_by_hand(tp: int) -> float:
    """80 layers x 2 ring all-reduces of one token's hidden state (8192 x 2 B), each
    10 µs + 2 (n-1)/n x bytes / 450 GB/s; one all-gather of the fp32 logits (128256 x 4 B),
    10 µs + (n-1)/n x bytes / 450 GB/s."""
    all_reduce = 10e-6 + 2 * (tp - 1) / tp * 16384 / 450e9
    all_gather = 10e-6 + (tp - 1) / tp * 128256 * 4 / 450e9
    return 160 * all_reduce + all_gather


def decode_by_hand(tp: int) -> float:
    """Memory-bound at batch 1: each GPU reads its shard of the weights and of the KV
    (2 of the 8 KV heads at TP 4: 2 x 80 x (8 / tp) x 128 x 2 B per token), then the
    collectives and the iteration overhead. (Activations, ~0.1% here, are left out.)"""
    kv_read = CONTEXT * 2 * 80 * (8 // tp) * 128 * 2
    return (DECODE_WEIGHT_BYTES / tp + kv_read) / EFFECTIVE_BW + comm_by_hand(tp) + OVERHEAD_S


def test_linear_params_by_hand():
    assert LINEAR_PER_LAYER == 855_638_016
    assert L70.weight_bytes("bf16") == pytest.approx(141.1e9, rel=1e-3)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_all_reduce_term_by_hand(tp):
    cm = CostModel(L70, "bf16", H100, tensor_parallel_size=tp)
    assert cm.communication_s(BatchShape(1, 1, CONTEXT, CONTEXT, 1)) == pytest.approx(
        comm_by_hand(tp), rel=1e-12
    )
    assert Interconnect(450e9, 10e-6).all_reduce_s(16384, tp) == pytest.approx(
        10e-6 + 2 * (tp - 1) / tp * 16384 / 450e9
    )


def test_tp4_batch1_decode_on_h100_is_between_the_weight_read_floor_and_twice_it():
    floor = L70.weight_bytes("bf16") / 4 / 3.35e12  # 141.1 GB / 4 / 3.35 TB/s
    assert floor == pytest.approx(10.5e-3, rel=0.01)
    t = decode_1(4)
    assert floor < t < 2 * floor, t
    assert t == pytest.approx(decode_by_hand(4), rel=2e-3)


def test_tp2_vs_tp4_follows_the_model():
    t2, t4 = decode_1(2), decode_1(4)
    assert t2 == pytest.approx(decode_by_hand(2), rel=2e-3)
    assert t2 / t4 == pytest.approx(decode_by_hand(2) / decode_by_hand(4), rel=2e-3)
    # Halving the shard halves the weight read, but not the collectives and the overhead:
    # the speed-up from TP 2 to TP 4 is real and short of 2x (about 1.87x here).
    assert 1.8 < t2 / t4 < 1.95


def test_the_all_reduce_grows_with_the_batch_and_slows_over_pcie():
    shape = BatchShape(2048, 8, 2048 * 1024, 2048, 8)
    nvlink = CostModel(L70, "bf16", H100, tensor_parallel_size=4).communication_s(shape)
    pcie = CostModel(L70, "bf16", get_gpu_spec("h100-pcie"),
                     tensor_parallel_size=4).communication_s(shape)
    # 2048 tokens x 8192 x 2 B = 32 MiB per all-reduce: bandwidth-bound, 7x slower on PCIe 5.
    assert pcie > 6 * nvlink
    assert nvlink > 160 * (2 * 3 / 4 * 2048 * 8192 * 2 / 450e9)


def test_kv_capacity_per_gpu_by_hand():
    # Each H100 holds 79.2 GiB (its CUDA total) x 0.9 - 2 GiB, less a quarter of the weights; a token's KV on
    # one GPU: 2 x 80 layers x 2 KV heads x 128 x 2 B = 81,920 B.
    free = 79.2 * 1024**3 * 0.9 - 2 * 1024**3 - L70.weight_bytes("bf16") / 4
    expected = int(free // 81_920) // 16
    assert sim_num_kv_blocks(L70, H100, 16, tensor_parallel_size=4) == expected
    assert 29_000 < expected < 30_000
    with pytest.raises(ValueError, match="does not fit"):
        sim_num_kv_blocks(L70, H100, 16)


def _quiet(_msg: str) -> None:
    pass


@pytest.mark.parametrize(("gpu", "tp"), [("h100", 4), ("h200", 2)])
def test_llama_70b_runs_on_4_h100_or_2_h200(gpu, tp):
    spec = run_spec(workload="sharegpt", num_requests=30, request_rate=5.0,
                   engine=EngineArgs(engine="sim", gpu=gpu, model="llama-3.1-70b",
                                     tensor_parallel_size=tp))
    result = execute_run(spec)
    assert result.summary.completed == 30
    assert result.config.tensor_parallel_size == tp


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "sim", "--model", "llama-3.1-70b", "--gpu", "h100"], "does not fit"),
        (["--engine", "sim", "--tensor-parallel-size", "3"], "cannot be split 3 ways"),
        (["--engine", "torch", "--tensor-parallel-size", "2"], "runs on one device"),
        (["--engine", "torch", "--data-parallel-size", "2"], "runs on one device"),
    ],
)
def test_bad_parallelism_is_one_line_and_exit_2(args, message, tmp_path):
    r = CliRunner().invoke(app, ["run", *args, "--num-requests", "3",
                                 "--output", str(tmp_path / "r.json")])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error:") and message in lines[0]
