"""The compiled fused layer kernels and split-K decode attention against the PyTorch reference
on a CUDA GPU, at Llama-3-8B's shapes, in bf16 and fp16.

The CPU checks the same kernels under Triton's interpreter at small shapes
(test_fused_kernels.py, test_kernels_split_k.py, test_kernels_gpu_tiles.py); those files carry
no ``cuda`` mark, so tests/gpu/gpu_check.sh's pytest step (``-m cuda``) would never compare the
*compiled* kernels, which the ShareGPT runs use by default on CUDA. This file does. Skipped
without a GPU (conftest.py); no hypothesis, which the GPU image may lack.

Compile budget (the GPU check's pytest step): per dtype, the norm kernel twice (with and
without the residual add), RoPE twice (with and without the KV store), SiLU-and-mul, and the
split-K pair (partial + reduce): ~7 variants x 2 dtypes. The bf16 ones at block size 16 are
the shapes the decode and ShareGPT steps compile next, so Triton's on-disk cache hands them on.

Tolerances: the norm and RoPE outputs within one rounding step of the dtype, relative (as in
test_fused_kernels.py: both sides round the same float32 value, the compiled reduction order
may move it by one step); attention within test_kernels.py's ATOL against float64 attention.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from paged_batches import assert_close, dense_attention, make_batch  # noqa: E402

from cbbench.engine.model_config import MODEL_PRESETS  # noqa: E402
from cbbench.engine.torch.models.llama import rope_inv_freq  # noqa: E402
from cbbench.kernels.backend import write_kv_torch  # noqa: E402
from cbbench.kernels.fused_rope import rope_triton  # noqa: E402
from cbbench.kernels.layer_ops import FusedLayerOps, LayerOps, rope_torch  # noqa: E402

pytestmark = pytest.mark.cuda

DEVICE = "cuda"
DTYPES = [torch.bfloat16, torch.float16]
TOL = {torch.float16: 2**-7, torch.bfloat16: 2**-6}  # one rounding step near |x| ~ 1
LLAMA = MODEL_PRESETS["llama-3.1-8b"]  # llama-3-8b's shapes, with llama3 RoPE scaling
BLOCK_SIZE = 16
NUM_TOKENS = 37  # a prefill chunk's worth of rows, not a power of two
REF = LayerOps()
FUSED = FusedLayerOps()


def _randn(*shape, dtype, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def _close(actual, expected, dtype):
    torch.testing.assert_close(actual.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_cuda(dtype):
    hidden = LLAMA.hidden_size
    x = _randn(NUM_TOKENS, hidden, dtype=dtype, scale=3.0)
    residual = _randn(NUM_TOKENS, hidden, dtype=dtype, seed=1)
    weight = _randn(hidden, dtype=dtype, seed=2)
    eps = 1e-5
    _close(FUSED.rms_norm(x, weight, eps), REF.rms_norm(x, weight, eps), dtype)
    normed, new_residual = FUSED.add_rms_norm(x, residual, weight, eps)
    ref_normed, ref_residual = REF.add_rms_norm(x, residual, weight, eps)
    assert torch.equal(new_residual, ref_residual)  # one rounding of the same sum
    _close(normed, ref_normed, dtype)


def _rope_tables(max_len: int):
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), rope_inv_freq(LLAMA))
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def _qkv(dtype):
    """q, k, v as the model makes them: strided views into one fused projection."""
    heads, kv_heads, dim = LLAMA.num_heads, LLAMA.num_kv_heads, LLAMA.head_dim
    qkv = _randn(NUM_TOKENS, (heads + 2 * kv_heads) * dim, dtype=dtype, scale=2.0)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    return (q.view(NUM_TOKENS, heads, dim), k.view(NUM_TOKENS, kv_heads, dim),
            v.view(NUM_TOKENS, kv_heads, dim))  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_write_kv_cuda(dtype):
    """Rotation alone, then rotation fused with the paged KV store: same q, same cache, and
    a padding row (slot -1) writes nothing (the guard blocks either side stay untouched)."""
    max_len = 8192
    cos, sin = _rope_tables(max_len)
    q, k, v = _qkv(dtype)
    gen = torch.Generator().manual_seed(3)
    positions = torch.randint(0, max_len, (NUM_TOKENS,), generator=gen).to(DEVICE)
    ref_rope = REF.prepare_rope(positions, cos, sin)
    fused_rope = FUSED.prepare_rope(positions, cos, sin)
    q_out, k_out = rope_triton(q, k, positions, cos, sin)
    _close(q_out, rope_torch(q, *ref_rope), dtype)
    _close(k_out, rope_torch(k, *ref_rope), dtype)

    num_blocks = -(-NUM_TOKENS // BLOCK_SIZE) + 4
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:NUM_TOKENS].clone()
    slots[5] = -1
    slots = slots.to(DEVICE)
    shape = (num_blocks + 2, BLOCK_SIZE, LLAMA.num_kv_heads, LLAMA.head_dim)
    buffers = [_randn(*shape, dtype=dtype, seed=s) for s in (10, 11)]
    guards = [b[[0, -1]].clone() for b in buffers]
    caches = [b[1:-1] for b in buffers]
    ref_caches = [c.clone() for c in caches]
    ref_q = REF.rope_and_write_kv(q, k, v, ref_rope, *ref_caches, slots, write_kv_torch)
    out_q = FUSED.rope_and_write_kv(q, k, v, fused_rope, *caches, slots, write_kv=None)
    _close(out_q, ref_q, dtype)
    _close(caches[0], ref_caches[0], dtype)
    assert torch.equal(caches[1], ref_caches[1])  # v is copied, not computed
    for buffer, guard in zip(buffers, guards, strict=True):
        assert torch.equal(buffer[[0, -1]], guard)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_cuda(dtype):
    x = _randn(NUM_TOKENS, 2 * LLAMA.intermediate_size, dtype=dtype, scale=3.0)
    _close(FUSED.silu_and_mul(x), REF.silu_and_mul(x), dtype)


# (context lengths before each request's one new token, forced splits or None = the chooser's)
SPLIT_CASES = [
    pytest.param([8191], None, id="b1-8k-chosen"),  # what split-K exists for
    # Issue 39's latency case: 32 splits of 17 keys (31 hold keys), one 128-key iteration each.
    pytest.param([512], None, id="b1-512-chosen"),
    pytest.param([0, 700, 3000, 15, 255, 1000, 31], 4, id="b7-ragged-4splits"),
]


@pytest.mark.parametrize(("contexts", "splits"), SPLIT_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_cuda_llama_shapes(dtype, contexts, splits):
    """Compiled split-K decode (GPU tiles, 32 q / 8 kv heads of 128) against float64
    attention over the unpaged keys; the chooser must split batch 1 at 8k on this GPU."""
    from cbbench.kernels.triton_attention import TritonBackend

    gqa = LLAMA.num_heads // LLAMA.num_kv_heads
    batch = make_batch(
        [1] * len(contexts), contexts, BLOCK_SIZE, gqa, dtype, device=DEVICE,
        head_dim=LLAMA.head_dim, num_kv_heads=LLAMA.num_kv_heads, seed=len(contexts),
    )  # fmt: skip
    backend = TritonBackend(decode_splits=splits)
    chosen = backend.choose_decode_splits(batch.metadata, LLAMA.num_kv_heads, batch.query.device)
    assert chosen > 1, "the case must take the split-K path"
    scale = LLAMA.head_dim**-0.5
    out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, scale)
    assert out.dtype == dtype
    assert_close(out, dense_attention(batch, scale), dtype)
