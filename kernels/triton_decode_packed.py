"""GQA-packed decode attention: one program per (request, kv head), its rows the query heads
that share that kv head, for pure-decode batches whose keys are not split.

Why a kernel of its own. The unified kernel (:mod:`.triton_attention`) gives a program
``BLOCK_Q`` tokens x ``GROUP_PAD`` heads of tile rows (16 at Llama-3-8B's group of 4: 4 tokens
x 4 heads). A decode request has ONE token, so 4 of those 16 rows hold work, ~1 program in 4 is
empty (the request-to-program map gives every request ``q_len / BLOCK_Q + 1`` programs), and
each program binary-searches its request. Here, as in FlashDecoding / FlashInfer's GQA decode,
the program IS the (request, kv head) pair and its rows are the group's query heads: no empty
programs, no search, each K/V tile loaded once for all of the group's heads.

Two ways to multiply (``USE_DOT``, a constexpr):

- ``tl.dot`` (tensor cores; ``decode_kernel="packed"``, the default): the group's heads padded
  to tl.dot's 16 rows (4 of 16 at a group of 4, as in FlashInfer's tensor-core decode), 64-key
  tiles; what it saves over the unified kernel is the empty programs and the search;
- CUDA cores (``decode_kernel="packed-cores"``): ``sum(q[:, :, None] * k[None, :, :])`` with
  exactly ``next_pow2(group)`` rows (no padding rows below 16 heads; tensor cores from 16), the
  key tile cut so the broadcast product stays at ``CORE_TILE_ELEMENTS`` per program. Compiled
  for sm_90 (Triton 3.9) it needs ~210-230 registers a thread against ~90-120 for the dot
  variants (2 blocks of 4 warps per SM instead of 4-5, and 16-key tiles): decode attention is
  bandwidth-bound and occupancy is what keeps bytes in flight, so it is not the default until
  the GPU check's side-by-side timing (``decode_attention_us``) says otherwise.

Every per-step integer (request count, block-table width, lengths) is a runtime argument or a
device tensor: graph-capture safe, and no re-specialization as the batch changes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .metadata import AttentionMetadata
from .triton_common import launch, next_pow2
from .triton_dot import LOG2_E, MIN_DOT, NEG_BIG, attention_dot, dot_precision

# Elements of the CUDA-core path's broadcast product (rows x head dim x keys) per program:
# 8192 fp32 over 4 warps is 64 registers a thread.
CORE_TILE_ELEMENTS = 8192
MIN_CORE_KEYS = 8
NUM_WARPS = 4


@triton.jit(do_not_specialize=["stride_bt"])
def _packed_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    cu_seqlens_q_ptr, seq_lens_ptr, block_tables_ptr,
    scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    GROUP: tl.constexpr, M_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr, USE_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    tok = tl.load(cu_seqlens_q_ptr + req).to(tl.int64)
    q_len = tl.load(cu_seqlens_q_ptr + req + 1) - tok
    seq_len = tl.load(seq_lens_ptr + req)
    end = tl.where(q_len > 0, seq_len, 0)  # a request without a row attends nothing

    g = tl.arange(0, M_PAD)
    heads = tl.where(q_len > 0, GROUP, 0)  # scalar folded into the bound (interpreter-safe)
    row_valid = g < heads
    head = kv_head * GROUP + g
    d = tl.arange(0, DIM_PAD)
    d_valid = d < HEAD_DIM
    q = tl.load(q_ptr + tok * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_valid[:, None] & d_valid[None, :], other=0.0)  # fmt: skip
    if not USE_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([M_PAD], NEG_BIG, tl.float32)
    l_i = tl.zeros([M_PAD], tl.float32)
    acc = tl.zeros([M_PAD, DIM_PAD], tl.float32)
    table = block_tables_ptr + req.to(tl.int64) * stride_bt
    for n_start in range(0, end, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        n_valid = n < end
        block = tl.load(table + n // KV_BLOCK_SIZE, mask=n_valid, other=0).to(tl.int64)
        offset = n % KV_BLOCK_SIZE
        k = tl.load(k_cache_ptr + block[None, :] * stride_kb + offset[None, :] * stride_ks
                    + kv_head * stride_kh + d[:, None],
                    mask=n_valid[None, :] & d_valid[:, None], other=0.0)  # fmt: skip
        if USE_DOT:
            s = attention_dot(q, k, DOT_PRECISION)  # [M_PAD, BLOCK_N]
        else:
            s = tl.sum(q[:, :, None] * k.to(tl.float32)[None, :, :], axis=1)
        s = tl.where(n_valid[None, :], s * scale_log2, float("-inf"))  # log2 domain
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs
                    + kv_head * stride_vh + d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)  # fmt: skip
        if USE_DOT:
            pv = attention_dot(p.to(v.dtype), v, DOT_PRECISION)
        else:
            pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # rows without keys write zeros
    tl.store(out_ptr + tok * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])  # fmt: skip


def packed_tile(group: int, head_dim: int, block_n: int, cores: bool = False) -> tuple[int, int, bool]:
    """(rows, keys per tile, use tl.dot) for a kv group of ``group`` query heads. Tensor cores
    (the default): the group's heads padded to tl.dot's 16 rows, ``block_n`` keys. ``cores``:
    exactly ``next_pow2(group)`` rows on CUDA cores (tensor cores still from 16 heads), the key
    tile cut so rows x head dim x keys stays within CORE_TILE_ELEMENTS."""
    rows = next_pow2(group)
    if not cores or rows >= MIN_DOT:
        return max(MIN_DOT, rows), block_n, True
    dim_pad = max(MIN_DOT, next_pow2(head_dim))
    keys = max(MIN_CORE_KEYS, min(block_n, CORE_TILE_ELEMENTS // (rows * dim_pad)))
    return rows, keys, False  # powers of two: CORE_TILE_ELEMENTS, rows, dim_pad, block_n


def packed_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    block_n: int,
    block_tables: torch.Tensor,
    cores: bool = False,
) -> torch.Tensor:
    """Attention for a batch whose requests have at most one row each (``max_seqlen_q <= 1``)
    and unit-stride head dims; ``block_tables`` has unit column stride. One launch.
    ``cores``: the CUDA-core variant (see ``packed_tile``)."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    rows, keys, use_dot = packed_tile(group, head_dim, block_n, cores)
    out = torch.empty_like(query)
    is_fp32 = query.dtype == torch.float32
    launch(
        _packed_decode_kernel, (metadata.num_reqs, num_kv_heads),
        query, k_cache, v_cache, out,
        metadata.cu_seqlens_q, metadata.seq_lens, block_tables,
        scale * LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, M_PAD=rows, HEAD_DIM=head_dim, DIM_PAD=max(MIN_DOT, next_pow2(head_dim)),
        BLOCK_N=keys, KV_BLOCK_SIZE=metadata.block_size, USE_DOT=use_dot,
        DOT_PRECISION=dot_precision(query.dtype), num_warps=NUM_WARPS,
        **({"num_stages": 1} if is_fp32 else {}),
    )  # fmt: skip
    return out
