"""The analytic bytes/FLOPs formulas against figures computed by hand (Llama-3-8B, bf16)."""

from __future__ import annotations

import pytest

from cbbench.engine.model_config import MODEL_PRESETS, ModelConfig
from cbbench.engine.sim.cost_model import BatchShape, CostModel
from cbbench.engine.sim.gpu_specs import get_gpu_spec

LLAMA3_8B = MODEL_PRESETS["llama-3-8b"]
# Published figures for Meta-Llama-3-8B: 8,030,261,248 parameters, of which the input embedding
# is 128,256 x 4096 = 525,336,576 and the RMSNorm weights 65 x 4096 = 266,240 (two per layer and
# the final one). A decode step multiplies every other weight once: 7,504,658,432 parameters,
# 15,009,316,864 bytes in bf16 (the input embedding is read only at the batch's rows).
PUBLISHED_PARAMS = 8_030_261_248
MATMUL_PARAMS = PUBLISHED_PARAMS - 525_336_576 - 266_240
KV_BYTES_PER_TOKEN = 131_072  # 2 (K, V) x 32 layers x 8 kv heads x 128 dims x 2 bytes
MB = 1_000_000


def test_kv_bytes_per_token_llama3_8b():
    assert LLAMA3_8B.kv_bytes_per_token("bf16") == KV_BYTES_PER_TOKEN


def test_weight_bytes_llama3_8b():
    assert LLAMA3_8B.num_params == PUBLISHED_PARAMS
    assert LLAMA3_8B.weight_bytes("bf16") == pytest.approx(16.06e9, rel=1e-3)


def test_decode_at_batch_1_reads_the_matmul_weights_and_the_kv_history():
    cm = CostModel(LLAMA3_8B, "bf16")
    cost = cm.cost(BatchShape(num_tokens=1, num_logits=1, attn_key_pairs=512, attn_keys_read=512))
    floor = 2 * MATMUL_PARAMS + 512 * KV_BYTES_PER_TOKEN  # 15,076,425,728 bytes
    # The rest is one row's activations, logits and KV write: a few MB against 15 GB.
    assert floor < cost.bytes < floor + 10 * MB
    # 2 FLOPs per multiply-add over every multiplied weight, plus QK^T and PV (2 x 2 FLOPs per
    # query-key pair and head dimension) over 32 heads x 128 dims x 32 layers x 512 keys.
    assert cost.flops == 2 * MATMUL_PARAMS + 4 * 32 * 128 * 32 * 512


def test_a_tiny_model_costs_what_it_costs_by_hand():
    # One layer, hidden 8, 2 query heads and 1 KV head of 4 dims (q 8 wide, k and v 4 each),
    # MLP 16, vocabulary 10, bf16. One decode row with 3 cached tokens: it attends 4 keys.
    tiny = ModelConfig(
        name="tiny", num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
        intermediate_size=16, vocab_size=10, max_model_len=64,
    )  # fmt: skip
    cost = CostModel(tiny, "bf16").cost(BatchShape(1, 1, 4, 4))
    # Bytes, worked out from the cost model's stated rules:
    #   GEMM weights: qkv 8x16 + o 8x8 + gate_up 8x32 + down 16x8 = 576 params  -> 1152
    #   GEMM activations, in + out: (8+16) + (8+8) + (8+32) + (16+8) = 104      ->  208
    #   attention: 4 keys read x 16 B of K+V per token (2 x 1 head x 4 x 2 B)  ->   64
    #              plus q and o, 8 values each                                 ->   32
    #   KV write of the new token                                              ->   16
    #   8 elementwise passes over the 8-wide hidden state                      ->  128
    #   the embedding row                                                      ->   16
    #   LM head: 10x8 weights (160) + 10 fp32 logits (40)                      ->  200
    #                                                                    total  1816
    assert cost.bytes == 1816
    # FLOPs: 2 x 576 (GEMMs) + 4 x 2 heads x 4 dims x 4 pairs (attention) + 2 x 80 (LM head).
    assert cost.flops == 1152 + 128 + 160


def test_roofline_time_is_memory_bound_at_batch_1_and_compute_bound_for_long_prefill():
    h200 = get_gpu_spec("h200")
    cm = CostModel(LLAMA3_8B, "bf16", h200)
    decode = cm.cost(BatchShape(1, 1, 512, 512))
    # Decode reads the input embedding only at the batch's rows: 15.01 GB, ~3.13 ms.
    read = (LLAMA3_8B.num_params - LLAMA3_8B.embedding_params) * 2
    floor = read / h200.hbm_bandwidth
    assert floor < decode.time_s < 2 * floor
    n = 4096
    prefill = cm.cost(BatchShape(n, 1, n * (n + 1) / 2, n))
    compute_floor = prefill.flops / h200.bf16_flops
    assert prefill.time_s > compute_floor
    assert prefill.flops / prefill.bytes > h200.ridge_point  # above the ridge: compute-bound


def test_h200_ridge_point():
    assert get_gpu_spec("h200").ridge_point == pytest.approx(206, rel=0.01)
