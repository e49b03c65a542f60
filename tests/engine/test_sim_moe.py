"""Mixture-of-experts models in the simulator, checked against hand arithmetic from each
model's published config.json (the numbers below are written out, not read from the code).

The decode floor of a memory-bound step is its bytes over the HBM bandwidth (eta = 1, no
overhead): at batch 1 a step reads the attention weights, the router, k experts per layer,
the lm_head and the request's KV; at a large batch every expert is touched.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import cli_in_process

from cbbench.engine.model_config import MODEL_PRESETS, from_hf_config, get_model_config
from cbbench.engine.sim.cost_model import BatchShape, CostModel, Efficiency
from cbbench.engine.sim.gpu_specs import get_gpu_spec
from cbbench.engine.sim.moe import expected_experts_touched
from cbbench.engine.sim.sim_executor import sim_num_kv_blocks

IDEAL = Efficiency(eta_memory=1.0, eta_compute=1.0, overhead_s=0.0)
H100_BW = 3.35e12
BF16 = 2


def _decode(batch: int, context: int) -> BatchShape:
    """``batch`` decode rows, each with ``context`` tokens already in its KV."""
    keys = float(batch * (context + 1))
    return BatchShape(batch, batch, keys, keys, batch, 0, keys)


def _activations_mixtral(T: int) -> float:
    """Activation bytes of T decode tokens through Mixtral-8x7B (the cost model's terms: each
    GEMM's inputs and outputs, q and o, the KV write, 8 elementwise passes, the embedding rows
    and fp32 logits)."""
    h, q, kv, ie, L, k, V = 4096, 4096, 1024, 14336, 32, 2, 32000
    pairs = T * k
    per_layer = (
        T * (h + q + 2 * kv)  # qkv
        + T * (q + h)  # o
        + T * h + pairs * (h + 2 * ie)  # router input, experts' gate_up
        + pairs * (ie + h)  # experts' down
        + 2 * T * q  # attention q read, o written
        + 8 * T * h  # elementwise
    )
    kv_write = T * 131072 / BF16  # in dtype units below
    return (per_layer * L + kv_write + T * h) * BF16 + T * V * 4


def test_mixtral_decode_floor_batch_1():
    """Batch 1, 1024 tokens of context, on an H100: the attention weights (qkv + o per layer:
    4096 x 6144 + 4096 x 4096), the router (4096 x 8), 2 experts of 3 x 4096 x 14336, the
    lm_head (32000 x 4096), one embedding row, and 1024 + 1 keys of 131,072 bytes."""
    attention = 4096 * 6144 + 4096 * 4096
    weights = 32 * (attention + 4096 * 8 + 2 * 3 * 4096 * 14336) + 32000 * 4096
    kv = 1025 * 131072
    floor_bytes = weights * BF16 + kv + _activations_mixtral(1)
    cm = CostModel(MODEL_PRESETS["mixtral-8x7b"], "bf16", get_gpu_spec("h100"), IDEAL)
    cost = cm.cost(_decode(1, 1024))
    assert cost.bytes == pytest.approx(floor_bytes, rel=1e-9)
    assert cost.time_s == pytest.approx(floor_bytes / H100_BW, rel=1e-9)
    # ~7.7 ms: an 8B-active-class step, far from the 46.7B total's 27.9 ms.
    assert 7.5e-3 < cost.time_s < 7.9e-3
    # FLOPs: the 12.9B active parameters, not the 46.7B total (plus attention's 4 x 32 x 128
    # per key per layer).
    active = 32 * (attention + 4096 * 8 + 2 * 3 * 4096 * 14336) + 32000 * 4096
    assert cost.flops == pytest.approx(2 * active + 4 * 32 * 128 * 32 * 1025, rel=1e-9)


def test_mixtral_decode_floor_large_batch():
    """Batch 256: 8 (1 - 6/8)^256 ~ 1e-31 experts missed, so all 8 are read per layer."""
    T = 256
    attention = 4096 * 6144 + 4096 * 4096
    weights = 32 * (attention + 4096 * 8 + 8 * 3 * 4096 * 14336) + 32000 * 4096
    kv = T * 1025 * 131072
    floor_bytes = weights * BF16 + kv + _activations_mixtral(T)
    cm = CostModel(MODEL_PRESETS["mixtral-8x7b"], "bf16", get_gpu_spec("h100"), IDEAL)
    cost = cm.cost(_decode(T, 1024))
    assert cost.bytes == pytest.approx(floor_bytes, rel=1e-9)
    assert cost.time_s == pytest.approx(floor_bytes / H100_BW, rel=1e-9)


def test_qwen3_partial_expert_coverage():
    """Qwen3-30B-A3B (128 experts, top 8) at batch 16: 128 (1 - (15/16)^16) = 82.42 experts per
    layer, each 3 x 2048 x 768. The expert bytes between batch 1 and batch 16 grow by exactly
    (82.42 - 8) experts per layer, plus what the activations add."""
    cm = CostModel(MODEL_PRESETS["qwen3-30b-a3b"], "bf16", get_gpu_spec("h100"), IDEAL)
    touched = 128 * (1 - (15 / 16) ** 16)
    assert touched == pytest.approx(82.42, abs=0.01)
    assert cm.experts_touched(16) == pytest.approx(touched, rel=1e-12)
    one, sixteen = cm.cost(_decode(1, 0)), cm.cost(_decode(16, 0))
    expert = 3 * 2048 * 768 * BF16
    act_per_token = (sixteen.bytes - one.bytes - 48 * (touched - 8) * expert) / 15
    # What is left is per-token traffic, equal per token: ~9.6 MB (48 layers x 91,136 bf16
    # activation values, 0.6 MB of fp32 logits, 2 x 98 kB of KV), beside 9.4 MB for each
    # expert touched in each layer.
    assert 9.0e6 < act_per_token < 1.0e7
    two = cm.cost(_decode(2, 0))
    touched2 = 128 * (1 - (15 / 16) ** 2)
    assert two.bytes - one.bytes == pytest.approx(48 * (touched2 - 8) * expert + act_per_token,
                                                  rel=1e-6)


def test_expected_experts_matches_monte_carlo():
    """The formula is the mean of the distinct experts B tokens hit choosing k of E each,
    uniformly at random: checked against 4,000 simulated batches per case."""
    rng = np.random.default_rng(0)
    for E, k, B in ((8, 2, 1), (8, 2, 3), (128, 8, 16), (32, 4, 10), (128, 8, 200)):
        hits = []
        for _ in range(4000):
            chosen = np.argsort(rng.random((B, E)), axis=1)[:, :k]
            hits.append(len(np.unique(chosen)))
        mean, sem = np.mean(hits), np.std(hits) / np.sqrt(len(hits))
        assert abs(expected_experts_touched(E, k, B) - mean) < 4 * sem + 1e-9, (E, k, B)
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2.0)


def test_gpt_oss_weights_are_mxfp4_experts():
    """gpt-oss-20b: 20.9B parameters, 3.6B active (without the input embedding), experts in
    MXFP4 (4.25 bits) and the rest in bf16: ~13.8 GB, as its published checkpoint."""
    m = MODEL_PRESETS["gpt-oss-20b"]
    assert m.num_params / 1e9 == pytest.approx(20.91, abs=0.01)
    assert (m.active_params - m.embedding_params) / 1e9 == pytest.approx(3.61, abs=0.01)
    experts = 24 * 32 * (3 * 2880 * 2880 + 3 * 2880)
    assert m.expert_params == experts
    assert m.weight_bytes("bf16") == pytest.approx(
        (m.num_params - experts) * 2 + experts * 4.25 / 8, abs=1
    )
    assert MODEL_PRESETS["mixtral-8x7b"].num_params / 1e9 == pytest.approx(46.70, abs=0.01)
    assert MODEL_PRESETS["qwen3-30b-a3b"].num_params / 1e9 == pytest.approx(30.53, abs=0.01)
    assert MODEL_PRESETS["qwen3-30b-a3b"].active_params / 1e9 == pytest.approx(3.35, abs=0.01)


def test_expert_parallel_all_to_all_and_pool():
    """Mixtral over 2 H100s, experts parallel: each GPU reads half the experts and has its own
    KV pool; every MoE layer adds two all-to-alls, each moving (2-1)/2 of the GPU's T/2 x 2
    hidden states (4096 x 2 bytes) over NVLink 4 (450 GB/s, 10 us)."""
    m, gpu = MODEL_PRESETS["mixtral-8x7b"], get_gpu_spec("h100")
    ep2 = CostModel(m, "bf16", gpu, IDEAL, expert_parallel_size=2)
    T = 64
    per_gpu = T / 2 * 2 * 4096 * BF16
    expected = 2 * 32 * (10e-6 + 0.5 * per_gpu / 450e9)
    assert ep2.communication_s(_decode(T, 0)) == pytest.approx(expected, rel=1e-12)
    # Mixtral (93.4 GB) does not fit one H100; over two, each holds the non-expert weights
    # and 4 of the 8 experts per layer.
    with pytest.raises(ValueError, match="does not fit"):
        sim_num_kv_blocks(m, gpu, 16)
    blocks = sim_num_kv_blocks(m, gpu, 16, expert_parallel_size=2)
    non_expert = m.weight_bytes() - m.expert_params * 2
    per_gpu_free = 79.2 * 1024**3 * 0.9 - 2 * 1024**3 - (non_expert + m.expert_params * 2 / 2)
    assert blocks == 2 * int(per_gpu_free // 131072) // 16


def _write_config(folder, cfg: dict):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


MIXTRAL_CONFIG = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "rope_theta": 1e6,
    "num_local_experts": 8, "num_experts_per_tok": 2,
}  # fmt: skip


def test_config_folder_reads_experts(tmp_path):
    m = from_hf_config(_write_config(tmp_path / "mixtral", MIXTRAL_CONFIG) / "config.json")
    p = MODEL_PRESETS["mixtral-8x7b"]
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (8, 2, 14336)
    assert m.num_params == p.num_params
    oss = dict(model_type="gpt_oss", hidden_size=2880, intermediate_size=2880,
               num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8,
               head_dim=64, vocab_size=201088, num_local_experts=32, experts_per_token=4,
               attention_bias=True, quantization_config={"quant_method": "mxfp4"},
               rope_scaling={"rope_type": "yarn", "factor": 32.0})
    m = get_model_config(str(_write_config(tmp_path / "oss", oss)))
    assert m.weight_bytes() == MODEL_PRESETS["gpt-oss-20b"].weight_bytes()


def test_moe_config_without_expert_fields_is_one_line_exit_2(tmp_path):
    cfg = {k: v for k, v in MIXTRAL_CONFIG.items() if k != "num_local_experts"}
    folder = _write_config(tmp_path / "broken", cfg)
    # The console script's entry in this process: its exit status and stderr, no second
    # interpreter's start-up.
    proc = cli_in_process(["run", "--engine", "sim", "--model", str(folder),
                           "--num-requests", "2", "--output", str(tmp_path / "r.json")])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), proc.stderr
    assert "num_local_experts" in lines[0]
    assert not (tmp_path / "r.json").exists()


def test_gpt_oss_run_on_simulated_h100(tmp_path):
    """A whole run: gpt-oss-20b on a simulated H100. Its decode steps sit above the batch-1
    floor (4.1 GB of weights read at 3.35 TB/s x 0.8 = 1.5 ms, with 4 of 32 experts) and below
    the floor of reading every expert."""
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    spec = run_spec(workload="sharegpt", num_requests=100, request_rate=20.0,
                   engine=EngineArgs(engine="sim", gpu="h100", model="gpt-oss-20b"))
    result = execute_run(spec)
    s = result.summary
    assert s.completed == 100 and result.config.model == "gpt-oss-20b"
    m = MODEL_PRESETS["gpt-oss-20b"]
    one_token = m.weight_bytes() - m.expert_params * (1 - 4 / 32) * 4.25 / 8
    one_token -= m.embedding_params * 2  # the embedding is read at the batch's rows only
    all_experts = m.weight_bytes() - m.embedding_params * 2
    rate = 3.35e12 * 0.8
    decode = [it for it in result.iterations if it.num_prefill_tokens == 0]
    assert decode
    for it in decode:
        assert it.duration_s > one_token / rate
        assert it.duration_s - 300e-6 < all_experts / rate * 1.05
    assert s.tpot_ms.p50 > one_token / rate * 1e3


def test_torch_engine_refuses_moe():
    from cbbench.engine.torch.models.loader import check_dense

    with pytest.raises(ValueError, match="mixture-of-experts"):
        check_dense(MODEL_PRESETS["qwen3-30b-a3b"])


def _busiest_monte_carlo(E: int, k: int, ep: int, T: int, rng, n: int = 4000):
    """Mean and standard error of the distinct experts on the most-loaded of ep GPUs (experts
    0..E/ep-1 on GPU 0, and so on), T tokens each choosing k distinct experts uniformly."""
    g = E // ep
    loads = []
    for _ in range(n):
        chosen = np.unique(np.argsort(rng.random((T, E)), axis=1)[:, :k])
        loads.append(np.bincount(chosen // g, minlength=ep).max())
    return np.mean(loads), np.std(loads) / np.sqrt(n)


def test_busiest_gpu_experts_match_monte_carlo():
    """Under expert parallelism each MoE layer's all-to-all waits for the GPU with the most
    experts to read: the exact expectation (moe.BusiestGPU) against 4,000 seeded batches per
    case. By hand: Mixtral (E 8, top 2) at batch 1 over 8 GPUs (one expert each): the token's
    2 experts sit on 2 GPUs, each reads 1 whole expert -> 1.0 (the average was 8/8 x 2/8 =
    0.25). Over 2 GPUs (4 experts each): both picks on one GPU with probability
    2 C(4,2) / C(8,2) = 12/28 (load 2), else 1 each -> 1 + 12/28 = 1.4286 (was 1.0)."""
    from cbbench.engine.sim.moe import BusiestGPU

    assert BusiestGPU(8, 2, 8).expected_max(1) == pytest.approx(1.0, abs=1e-12)
    assert BusiestGPU(8, 2, 2).expected_max(1) == pytest.approx(1 + 12 / 28, abs=1e-12)
    rng = np.random.default_rng(0)
    for E, k, ep, T in ((8, 2, 8, 1), (8, 2, 2, 1), (8, 2, 2, 3), (8, 2, 4, 16),
                        (32, 4, 4, 10), (128, 8, 8, 16), (128, 8, 4, 64)):
        mean, sem = _busiest_monte_carlo(E, k, ep, T, rng)
        exact = BusiestGPU(E, k, ep).expected_max(T)
        assert abs(exact - mean) < 4 * sem + 1e-9, (E, k, ep, T, exact, mean)
        # never below the average, never above a GPU's share
        assert expected_experts_touched(E, k, T) / ep - 1e-9 <= exact <= E // ep + 1e-9


def test_mixtral_ep8_batch_1_decode_reads_the_busiest_gpu():
    """The reviewer's case: Mixtral over 8 H100s, experts parallel, one request decoding at a
    1000-token context. The busiest GPU (which every layer's all-to-all waits for) holds the
    request and one of its two experts per layer, and reads (bf16):
      replicated attention 32 x (4096 x 6144 + 4096 x 4096) x 2 B = 2.684 GB
      one expert per layer 32 x 3 x 4096 x 14336 x 2 B          = 11.274 GB
      the lm_head 32000 x 4096 x 2 B                             = 0.262 GB
      the request's KV 1001 keys x 131,072 B                     = 0.131 GB
    = 14.351 GB, >= 4.284 ms at 100% of 3.35 TB/s. (Was: 0.25 experts and 1/8 of the
    attention, KV and lm_head per GPU: TPOT 3.10 ms at the default efficiencies, below the
    floor.)"""
    m, gpu = MODEL_PRESETS["mixtral-8x7b"], get_gpu_spec("h100")
    attention = 32 * (4096 * 6144 + 4096 * 4096) * BF16
    expert = 32 * 3 * 4096 * 14336 * BF16
    lm_head = 32000 * 4096 * BF16
    kv = 1001 * 131072
    floor = attention + expert + lm_head + kv
    assert floor / 1e9 == pytest.approx(14.351, abs=1e-3)
    ep8 = CostModel(m, "bf16", gpu, IDEAL, expert_parallel_size=8)
    c = ep8.cost(_decode(1, 1000))
    # the router (32 x 4096 x 8 x 2 B = 2.1 MB) and activations on top: under 0.1%
    assert floor <= c.bytes <= floor * 1.001
    assert c.time_s >= floor / H100_BW  # 4.284 ms
    default = CostModel(m, "bf16", gpu, expert_parallel_size=8).cost(_decode(1, 1000))
    # the simulator's own 80% of the bandwidth and 300 us: ~5.66 ms, plus the all-to-alls
    assert default.time_s >= floor / (0.8 * H100_BW) + 300e-6
    # ep=2: 1 + 12/28 experts per layer on the busiest GPU, which holds the request
    ep2 = CostModel(m, "bf16", gpu, IDEAL, expert_parallel_size=2)
    c2 = ep2.cost(_decode(1, 1000))
    floor2 = attention + (1 + 12 / 28) * expert + lm_head + kv
    assert floor2 <= c2.bytes <= floor2 * 1.001


def test_expert_parallel_even_batch_keeps_the_even_split():
    """A batch of R requests with R a multiple of ep: each GPU holds R/ep of them, the
    attention side is the even split as before; only the experts' count moves to the busiest
    GPU's. ep=1 is unchanged: E (1 - (1 - k/E)^T), exactly."""
    m, gpu = MODEL_PRESETS["mixtral-8x7b"], get_gpu_spec("h100")
    ep2 = CostModel(m, "bf16", gpu, IDEAL, expert_parallel_size=2)
    assert ep2.local_share(64) == 0.5 and ep2.local_share(3) == pytest.approx(2 / 3)
    one = CostModel(m, "bf16", gpu, IDEAL)
    assert one.experts_touched(5) == expected_experts_touched(8, 2, 5)
