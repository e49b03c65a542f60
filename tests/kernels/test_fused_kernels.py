"""The fused Triton layer kernels against the PyTorch reference ops (``LayerOps``).

On a CPU the kernels run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET),
on a GPU compiled. None of them uses ``tl.dot``, so bf16 is checked under the interpreter too.
Tolerances: fp32 tight; fp16/bf16 within one rounding step of the dtype (both sides round the
same float32 value, so most elements agree exactly).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cbbench.engine.model_config import MODEL_PRESETS  # noqa: E402
from cbbench.engine.torch.models.llama import rope_inv_freq  # noqa: E402
from cbbench.kernels.backend import write_kv_torch  # noqa: E402
from cbbench.kernels.fused_rms_norm import add_rms_norm_triton, rms_norm_triton  # noqa: E402
from cbbench.kernels.fused_rope import rope_triton  # noqa: E402
from cbbench.kernels.layer_ops import FusedLayerOps, LayerOps, layer_ops, rope_torch  # noqa: E402
from cbbench.kernels.silu_and_mul import silu_and_mul_triton  # noqa: E402
from cbbench.kernels.triton_common import INTERPRETED  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# One rounding step of each dtype at the magnitudes used here (|x| <~ 8).
# (The interpreter's bf16 casts truncate rather than round: up to one more step.)
TOL = {torch.float32: 1e-5, torch.float16: 2**-7, torch.bfloat16: 2**-6}
REF = LayerOps()


def _randn(*shape, dtype, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def _close(actual, expected, dtype):
    torch.testing.assert_close(
        actual.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype], check_device=False
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 100])  # a power of two, and a masked tail
def test_rms_norm(dtype, hidden):
    x = _randn(7, hidden, dtype=dtype, scale=3.0)
    residual = _randn(7, hidden, dtype=dtype, seed=1)
    weight = _randn(hidden, dtype=dtype, seed=2)
    eps = 1e-5
    _close(rms_norm_triton(x, weight, eps), REF.rms_norm(x, weight, eps), dtype)
    normed, new_residual = add_rms_norm_triton(x, residual, weight, eps)
    ref_normed, ref_residual = REF.add_rms_norm(x, residual, weight, eps)
    if dtype == torch.bfloat16 and INTERPRETED:  # its bf16 casts truncate instead of rounding
        _close(new_residual, ref_residual, dtype)
    else:
        assert torch.equal(new_residual, ref_residual)  # one rounding of the same sum: exact
    _close(normed, ref_normed, dtype)
    assert new_residual.data_ptr() != residual.data_ptr()  # functional: inputs untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_residual_aliasing_x(dtype):
    """``add_rms_norm(x, x)``: the residual is x itself, so the sum is 2x, as ``LayerOps`` gives
    (the kernel once took an aliased residual for "no residual" and returned the new residual
    unwritten: whatever ``torch.empty_like`` held)."""
    x = _randn(5, 64, dtype=dtype, scale=3.0)
    weight = _randn(64, dtype=dtype, seed=2)
    normed, new_residual = FusedLayerOps().add_rms_norm(x, x, weight, 1e-6)
    ref_normed, ref_residual = REF.add_rms_norm(x, x, weight, 1e-6)
    assert torch.equal(new_residual, ref_residual)  # 2x: exact in any dtype
    _close(normed, ref_normed, dtype)


def test_rms_norm_single_row_and_empty():
    weight = _randn(64, dtype=torch.float32)
    x = _randn(1, 64, dtype=torch.float32)
    _close(rms_norm_triton(x, weight, 1e-6), REF.rms_norm(x, weight, 1e-6), torch.float32)
    assert rms_norm_triton(x[:0], weight, 1e-6).shape == (0, 64)
    with pytest.raises(ValueError, match="hidden"):
        rms_norm_triton(x, weight[:32], 1e-6)


def _tables(head_dim: int, max_len: int, llama3: bool):
    config = MODEL_PRESETS["llama-3.1-8b" if llama3 else "llama-2-7b"]
    config = type(config)(**{**config.__dict__, "head_dim": head_dim})
    inv_freq = rope_inv_freq(config)
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def _qkv(num_tokens, num_heads, num_kv_heads, head_dim, dtype):
    """q, k, v as the model makes them: strided views into one fused projection."""
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, scale=2.0)
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    return (
        q.view(num_tokens, num_heads, head_dim),
        k.view(num_tokens, num_kv_heads, head_dim),
        v.view(num_tokens, num_kv_heads, head_dim),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "llama3"), [(16, False), (24, True), (64, True)])
def test_rope(dtype, head_dim, llama3):
    cos, sin = _tables(head_dim, 4096, llama3)
    q, k, _ = _qkv(5, 4, 2, head_dim, dtype)
    positions = torch.tensor([0, 1, 17, 1000, 4095], device=DEVICE)
    rope = REF.prepare_rope(positions, cos, sin)
    q_out, k_out = rope_triton(q, k, positions, cos, sin)
    _close(q_out, rope_torch(q, *rope), dtype)
    _close(k_out, rope_torch(k, *rope), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [4, 16])
def test_rope_and_write_kv(dtype, block_size):
    """The fused op against the reference op: same q, same cache after the write, padding rows
    (slot -1) write nothing, and slots land in shuffled blocks."""
    num_tokens, num_heads, num_kv_heads, head_dim, num_blocks = 6, 8, 2, 32, 5
    cos, sin = _tables(head_dim, 2048, True)
    q, k, v = _qkv(num_tokens, num_heads, num_kv_heads, head_dim, dtype)
    positions = torch.tensor([3, 0, 9, 511, 2047, 7], device=DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(3))
    slots = slots[:num_tokens].clone()
    slots[2] = -1
    slots = slots.to(DEVICE)
    # Each cache is the middle of a buffer with a guard block on either side: a padding row
    # written at slot -1 would land in the first guard.
    shape = (num_blocks + 2, block_size, num_kv_heads, head_dim)
    buffers = [_randn(*shape, dtype=dtype, seed=s) for s in (10, 11)]
    guards = [b[[0, -1]].clone() for b in buffers]
    caches = [b[1:-1] for b in buffers]
    ref_caches = [c.clone() for c in caches]

    ref_rope = REF.prepare_rope(positions, cos, sin)
    ref_q = REF.rope_and_write_kv(q, k, v, ref_rope, *ref_caches, slots, write_kv_torch)
    ops = FusedLayerOps()
    rope = ops.prepare_rope(positions, cos, sin)
    out_q = ops.rope_and_write_kv(q, k, v, rope, *caches, slots, write_kv=None)
    _close(out_q, ref_q, dtype)
    _close(caches[0], ref_caches[0], dtype)
    assert torch.equal(caches[1], ref_caches[1])  # v is copied, not computed
    for buffer, guard in zip(buffers, guards):
        assert torch.equal(buffer[[0, -1]], guard)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("intermediate", [128, 1500])  # one block; several with a masked tail
def test_silu_and_mul(dtype, intermediate):
    x = _randn(3, 2 * intermediate, dtype=dtype, scale=3.0)
    _close(silu_and_mul_triton(x), REF.silu_and_mul(x), dtype)


def test_layer_ops_choice():
    assert type(layer_ops(False)) is LayerOps and not layer_ops(False).fused
    assert isinstance(layer_ops(True), FusedLayerOps) and layer_ops(True).fused
