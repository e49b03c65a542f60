"""The analytic bytes/FLOPs formulas against figures computed by hand (Llama-3-8B, bf16)."""

from __future__ import annotations

import pytest

from cbbench.engine.cost_model import BatchShape, CostModel
from cbbench.engine.gpu_specs import get_gpu_spec
from cbbench.engine.model_config import MODEL_PRESETS

LLAMA3_8B = MODEL_PRESETS["llama-3-8b"]
# Per layer: q,k,v (4096 x (4096 + 2 x 1024)), o (4096 x 4096), gate+up (4096 x 2 x 14336),
# down (14336 x 4096).
LINEAR_PARAMS_PER_LAYER = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
LM_HEAD_PARAMS = 4096 * 128256


def test_linear_params_per_layer_by_hand():
    assert LINEAR_PARAMS_PER_LAYER == 218_103_808


def test_kv_bytes_per_token_llama3_8b():
    # 2 (K and V) x 32 layers x 8 kv heads x 128 dims x 2 bytes
    assert LLAMA3_8B.kv_bytes_per_token("bf16") == 131_072


def test_weight_bytes_llama3_8b():
    assert LLAMA3_8B.num_params == 8_030_261_248
    assert LLAMA3_8B.weight_bytes("bf16") == pytest.approx(16.06e9, rel=1e-3)


def test_decode_flops_at_batch_1():
    cm = CostModel(LLAMA3_8B, "bf16")
    context = 511  # the row attends 512 keys
    cost = cm.cost(BatchShape(num_tokens=1, num_logits=1, attn_key_pairs=512, attn_keys_read=512))
    gemm = 2 * 32 * LINEAR_PARAMS_PER_LAYER + 2 * LM_HEAD_PARAMS
    attention = 4 * 32 * 128 * 32 * (context + 1)  # QK^T and PV: 2 FLOPs per MAC each
    assert cost.flops == gemm + attention
    assert gemm == pytest.approx(2 * 7.505e9, rel=1e-3)  # 2 x the non-embedding params


def test_decode_bytes_at_batch_1_are_the_weights_plus_kv():
    cm = CostModel(LLAMA3_8B, "bf16")
    cost = cm.cost(BatchShape(1, 1, 512, 512))
    weights = 2 * (32 * LINEAR_PARAMS_PER_LAYER + LM_HEAD_PARAMS)
    kv_read = 512 * 131_072
    # The rest: GEMM inputs/outputs (69,632 values per layer), 8 elementwise passes over the
    # hidden state per layer, q/o, the embedding row, the logits and the one KV write.
    activations = (
        2 * 32 * 69_632 + 8 * 4096 * 2 * 32 + 2 * 4096 * 2 * 32 + 4096 * 2 + 128256 * 4 + 131_072
    )
    assert cost.bytes == weights + kv_read + activations


def test_roofline_time_is_memory_bound_at_batch_1_and_compute_bound_for_long_prefill():
    h200 = get_gpu_spec("h200")
    cm = CostModel(LLAMA3_8B, "bf16", h200)
    decode = cm.cost(BatchShape(1, 1, 512, 512))
    floor = LLAMA3_8B.weight_bytes("bf16") / h200.hbm_bandwidth  # ~3.35 ms
    assert floor < decode.time_s < 2 * floor
    n = 4096
    prefill = cm.cost(BatchShape(n, 1, n * (n + 1) / 2, n))
    compute_floor = prefill.flops / h200.bf16_flops
    assert prefill.time_s > compute_floor
    assert prefill.flops / prefill.bytes > h200.ridge_point  # above the ridge: compute-bound


def test_h200_ridge_point():
    assert get_gpu_spec("h200").ridge_point == pytest.approx(206, rel=0.01)
