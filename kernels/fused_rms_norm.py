"""RMSNorm, and residual add + RMSNorm in one pass (vLLM's ``fused_add_rms_norm``).

A decoder layer adds each sublayer's output to the residual stream and normalizes the sum for
the next sublayer. Done in PyTorch that is ~8 elementwise kernels (add, cast, square, mean,
rsqrt, two multiplies, cast) over the hidden state; here it is one read of ``x`` and
``residual``, one write of the normed output and of the new residual.

Rounding follows the PyTorch reference (and Hugging Face) step for step: the sum is rounded to
the model dtype (that is the residual stream), the mean of squares accumulates in float32, the
normalized value is rounded to the dtype before the weight multiplies it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import check_device, launch, next_pow2

# Warps per row by row width: enough threads that each holds <= ~16 fp32 values.
MAX_NUM_WARPS = 16
ELEMENTS_PER_WARP = 512


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_r, stride_o, stride_ro, eps,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(residual_out_ptr.dtype.element_ty)  # the residual stream's dtype
        tl.store(residual_out_ptr + row * stride_ro + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / HIDDEN
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _num_warps(block: int) -> int:
    return max(1, min(MAX_NUM_WARPS, block // ELEMENTS_PER_WARP))


def _launch(x, residual, weight, eps, out, residual_out, has_residual: bool) -> None:
    """``has_residual`` is the caller's word, not ``residual is not x``: ``add_rms_norm(x, x)``
    (a residual that aliases x) must still add, giving 2x and writing ``residual_out``."""
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block = next_pow2(hidden)
    launch(
        _rms_norm_kernel, (num_tokens,),
        x, residual, weight, out, residual_out,
        x.stride(0), residual.stride(0), out.stride(0), residual_out.stride(0), eps,
        HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=has_residual,
        num_warps=_num_warps(block),
    )  # fmt: skip


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_device(x.device)
    if x.dim() != 2 or x.stride(-1) != 1 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"expected x [tokens, hidden] with contiguous rows and weight [hidden], got "
            f"{tuple(x.shape)} (strides {x.stride()}) and {tuple(weight.shape)}"
        )


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check(x, weight)
    out = torch.empty_like(x)
    _launch(x, x, weight, eps, out, out, has_residual=False)  # the residual pointers go unread
    return out


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight)
    if residual.shape != x.shape or residual.stride(-1) != 1 or residual.dtype != x.dtype:
        raise ValueError(
            f"residual {tuple(residual.shape)} {residual.dtype} does not match x "
            f"{tuple(x.shape)} {x.dtype}"
        )
    out = torch.empty_like(x)
    residual_out = torch.empty_like(residual)
    _launch(x, residual, weight, eps, out, residual_out, has_residual=True)
    return out, residual_out
