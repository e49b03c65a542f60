"""Rotary position embedding for q and k in one kernel, optionally fused with the KV-cache store.

Layout: GPT-NeoX / Hugging Face "rotate half": within a head, element ``j < d/2`` pairs with
``j + d/2``. The angle tables ``cos``/``sin`` ``[max_positions, d/2]`` (float32) are indexed by
each row's position, so any frequency scaling (Llama-3's "llama3" scaling included) arrives
through the tables. The rotation is computed in float32 and rounded to the model dtype once.

Fused with the store, one program per token rotates its q and k heads, writes the rotated q for
attention, and writes rotated k and v straight into the paged cache at ``slot_mapping[row]``
(a negative slot writes nothing: padding rows). That replaces ~12 elementwise kernels, the cos/
sin gathers' reuse aside, and the separate KV store kernel; nothing reads the device on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import check_device, launch, next_pow2

NUM_WARPS = 4


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, v_ptr, positions_ptr, cos_ptr, sin_ptr,
    q_out_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cos,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr, STORE_KV: tl.constexpr,
):  # fmt: skip
    # Head dims are contiguous (stride 1) everywhere: the wrapper checks it.
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + row).to(tl.int64)
    j = tl.arange(0, HALF_PAD)
    j_valid = j < HALF
    cos = tl.load(cos_ptr + pos * stride_cos + j, mask=j_valid, other=0.0)[None, :]
    sin = tl.load(sin_ptr + pos * stride_cos + j, mask=j_valid, other=0.0)[None, :]

    h = tl.arange(0, HEADS_PAD)[:, None]
    mask = (h < NUM_HEADS) & j_valid[None, :]
    src = q_ptr + row * stride_qt + h * stride_qh + j[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = q_out_ptr + row * stride_qot + h * stride_qoh + j[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(q_out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(q_out_ptr.dtype.element_ty), mask=mask)

    kh = tl.arange(0, KV_HEADS_PAD)[:, None]
    kv_heads = NUM_KV_HEADS
    if STORE_KV:
        slot = tl.load(slot_mapping_ptr + row).to(tl.int64)
        # A negative slot is a padding row: no kv heads to write. (A scalar folded into the
        # head bound rather than `tensor_mask & scalar_mask`, which the interpreter rejects.)
        kv_heads = tl.where(slot >= 0, NUM_KV_HEADS, 0)
    kmask = (kh < kv_heads) & j_valid[None, :]
    src = k_ptr + row * stride_kt + kh * stride_kh + j[None, :]
    k1 = tl.load(src, mask=kmask, other=0.0).to(tl.float32)
    k2 = tl.load(src + HALF, mask=kmask, other=0.0).to(tl.float32)
    k_rot1 = k1 * cos - k2 * sin
    k_rot2 = k2 * cos + k1 * sin
    if STORE_KV:
        block = slot // KV_BLOCK_SIZE
        offset = slot % KV_BLOCK_SIZE
        dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + kh * stride_kch + j[None, :]
        tl.store(dst, k_rot1.to(k_cache_ptr.dtype.element_ty), mask=kmask)
        tl.store(dst + HALF, k_rot2.to(k_cache_ptr.dtype.element_ty), mask=kmask)
        src = v_ptr + row * stride_vt + kh * stride_vh + j[None, :]
        v1 = tl.load(src, mask=kmask, other=0.0)
        v2 = tl.load(src + HALF, mask=kmask, other=0.0)
        dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + kh * stride_vch + j[None, :]
        tl.store(dst, v1.to(v_cache_ptr.dtype.element_ty), mask=kmask)
        tl.store(dst + HALF, v2.to(v_cache_ptr.dtype.element_ty), mask=kmask)
    else:
        dst = k_out_ptr + row * stride_kot + kh * stride_koh + j[None, :]
        tl.store(dst, k_rot1.to(k_out_ptr.dtype.element_ty), mask=kmask)
        tl.store(dst + HALF, k_rot2.to(k_out_ptr.dtype.element_ty), mask=kmask)


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_device(q.device)
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"expected q/k [tokens, heads, dim], got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    head_dim = q.shape[2]
    if head_dim % 2 or cos.shape[-1] != head_dim // 2 or cos.shape != sin.shape:
        raise ValueError(
            f"head dim {head_dim} must be even and the cos/sin tables [positions, {head_dim // 2}], "
            f"got {tuple(cos.shape)}, {tuple(sin.shape)}"
        )
    if (
        q.stride(-1) != 1
        or k.stride(-1) != 1
        or cos.stride(-1) != 1
        or sin.stride() != cos.stride()
    ):
        raise ValueError("q, k and the cos/sin tables need a contiguous last dimension")


def _launch(q, k, v, positions, cos, sin, q_out, k_out, k_cache, v_cache, slot_mapping) -> None:
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    store = k_cache is not None
    if num_tokens == 0:
        return
    # Without the store, the cache arguments are never read: pass k_out in their place.
    kc, vc = (k_cache, v_cache) if store else (k_out, k_out)
    kc_strides = kc.stride()[:3] if store else (0, 0, 0)
    vc_strides = vc.stride()[:3] if store else (0, 0, 0)
    launch(
        _rope_kernel, (num_tokens,),
        q, k, v if store else k, positions, cos, sin,
        q_out, k_out, kc, vc, slot_mapping if store else positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        *((v.stride(0), v.stride(1)) if store else (0, 0)),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos.stride(0),
        *kc_strides, *vc_strides,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEADS_PAD=next_pow2(num_heads),
        KV_HEADS_PAD=next_pow2(num_kv_heads), HALF=head_dim // 2, HALF_PAD=next_pow2(head_dim // 2),
        KV_BLOCK_SIZE=kc.shape[1] if store else 1, STORE_KV=store, num_warps=NUM_WARPS,
    )  # fmt: skip


def rope_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated ``(q, k)`` as new contiguous tensors; ``cos``/``sin`` are the full tables."""
    _check(q, k, cos, sin)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    _launch(q, k, None, positions, cos, sin, q_out, k_out, None, None, None)
    return q_out, k_out


def rope_store_kv_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """Rotated q (new, contiguous); rotated k and v written to the caches at ``slot_mapping``."""
    _check(q, k, cos, sin)
    if v.shape != k.shape or v.stride(-1) != 1:
        raise ValueError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} with contiguous dims")
    if (
        k_cache.shape != v_cache.shape
        or k_cache.shape[2:] != k.shape[1:]
        or k_cache.stride(-1) != 1
    ):
        raise ValueError(
            f"caches {tuple(k_cache.shape)} must be [blocks, block_size, {k.shape[1]}, "
            f"{k.shape[2]}] with a contiguous last dimension"
        )
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # k_out is never written when storing: the cache is k's destination.
    _launch(q, k, v, positions, cos, sin, q_out, q_out, k_cache, v_cache, slot_mapping)
    return q_out
