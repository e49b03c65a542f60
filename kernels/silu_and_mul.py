"""SiLU-and-mul for the SwiGLU MLP: ``[tokens, 2 * I] -> silu(x[:, :I]) * x[:, I:]``.

PyTorch runs it as three kernels (silu, mul, and the strided chunk read twice); this reads the
fused gate/up projection once and writes the product once. Rounding matches PyTorch: silu is
computed in float32 and rounded to the dtype before the product (also rounded).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import check_device, launch, next_pow2

BLOCK = 1024  # columns per program
NUM_WARPS = 4


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o,
    INTERMEDIATE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTERMEDIATE + cols, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    out = silu * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    check_device(x.device)
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(
            f"expected x [tokens, 2 * intermediate] with contiguous rows, got {x.shape}"
        )
    num_tokens, width = x.shape
    intermediate = width // 2
    out = torch.empty(num_tokens, intermediate, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block = min(BLOCK, next_pow2(intermediate))
    launch(
        _silu_and_mul_kernel, (num_tokens, triton.cdiv(intermediate, block)),
        x, out, x.stride(0), out.stride(0),
        INTERMEDIATE=intermediate, BLOCK=block, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
