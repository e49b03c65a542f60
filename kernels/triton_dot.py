"""The attention kernels' ``tl.dot``, the precision each dtype asks of it, and the constants
their online softmax shares.

Triton's interpreter computes ``tl.dot`` of bf16 tiles wrongly (Triton 3.9: ~1e10 off on a
16x16 product of unit normals; numpy has no bf16), while the same tiles cast to fp32 first
multiply exactly. A bf16 x bf16 product is exact in fp32 and tensor cores accumulate in fp32,
so the interpreted kernels upcast bf16 tiles before the dot ("upcast") and get what the GPU
computes up to summation order. That lets the CPU suite prove the bf16 decode paths' indexing,
masking and merging against the reference. Compiled kernels never take the upcast branch (it is
a constexpr): the GPU code is unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import INTERPRETED

UPCAST = "upcast"  # a DOT_PRECISION value: cast both tiles to fp32, then an exact (ieee) dot
MIN_DOT = 16  # tl.dot needs every tile dim >= 16
LOG2_E = 1.4426950408889634  # the kernels take exp2: scores are scaled by log2(e) up front
# A finite "minus infinity" for the running max, so fully masked tiles give exp(-inf) = 0
# instead of exp(-inf - -inf) = nan.
NEG_BIG = tl.constexpr(-1.0e30)


def dot_precision(dtype: torch.dtype) -> str:
    """``DOT_PRECISION`` for tiles of ``dtype``: fp32 must not silently drop to TF32 on tensor
    cores ("ieee"); fp16/bf16 ignore the setting ("tf32"), except bf16 interpreted."""
    if dtype == torch.float32:
        return "ieee"
    if INTERPRETED and dtype == torch.bfloat16:
        return UPCAST
    return "tf32"


@triton.jit
def attention_dot(a, b, DOT_PRECISION: tl.constexpr):
    """``tl.dot(a, b)`` in fp32 accumulation, as ``DOT_PRECISION`` asks (see the module)."""
    if DOT_PRECISION == "upcast":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=DOT_PRECISION)
    return out
