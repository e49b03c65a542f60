"""Split-K ("flash-decoding") attention for pure-decode batches over the paged cache.

The unified kernel gives one program per (request, kv head): at batch 1 with 8 kv heads that is
8 programs walking 8k keys each while 124 of an H200's 132 SMs idle. Here each request's keys
are cut into ``num_splits`` contiguous ranges, one program per (request, kv head, split), each
writing its partial output and log-sum-exp; a second kernel merges the splits per (row, head):
``out = sum_s exp(lse_s - m) * o_s / sum_s exp(lse_s - m)`` with ``m = max_s lse_s``.

The split count is chosen on the host from values known without reading the device
(``num_reqs``, ``max_seqlen_k``, the SM count), so a captured CUDA graph keeps its split count
while each replay's true lengths decide, on the device, which keys each split covers: split
``s`` of a request with ``seq_len`` keys takes keys ``[s * c, min((s + 1) * c, seq_len))`` with
``c = ceil(seq_len / num_splits)`` (:func:`split_bounds`), so a short context still spreads
over (nearly) every split instead of filling whole key tiles first; empty splits write
``lse = -inf`` and weigh nothing. Every per-step integer is a runtime argument marked
``do_not_specialize``: no recompilation as the batch changes.

The latency chain of one program is what decode at small batch waits on (the bytes are few:
2 MB a layer at batch 1, context 512, Llama-3-8B), so each iteration covers ``BLOCK_N`` keys
(128 on the GPU for 16-bit caches: up to 8 KV blocks of 16 keys, ``TileConfig.block_n_split``)
with the GQA group's query heads as the rows of one tile, and issues the V load beside the K
load, before the scores that only the V product needs: two dependent round trips to memory
per iteration (the block table, then K and V together), not three.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .metadata import AttentionMetadata
from .triton_common import launch, next_pow2
from .triton_dot import LOG2_E, MIN_DOT, NEG_BIG, attention_dot, dot_precision

# The least keys a split is given when the host knows the length (eager launches): one KV block
# of the smallest size. Masked keys of a tile cost no memory traffic, so a split need not fill a
# key tile; what a split costs is its partial output (head dim floats a query head). It was 64
# keys rounded up to whole 64-key tiles on the device, which left batch 1 at context 512 with
# 9 splits holding keys inside a graph (72 programs on 132 SMs), and 256 keys before that.
MIN_KEYS_PER_SPLIT = 16
# Upper bound on splits: the merge kernel loads all of them in one tile (a power of two).
MAX_SPLITS = 32
# Aim for this many programs per SM: a decode program is a short chain of dependent loads
# (block table -> K -> scores -> V), so two resident per SM keep bytes in flight while one waits.
TARGET_PROGRAMS_PER_SM = 2
# SMs assumed when no CUDA device can be asked (the interpreter, tools): an H100/H200.
DEFAULT_NUM_SMS = 132
NUM_WARPS = 4


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a host-side property query, no sync)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


def num_kv_splits(num_reqs: int, num_kv_heads: int, max_seqlen_k: int, sms: int) -> int:
    """Splits per request so that ``num_reqs * num_kv_heads * splits`` programs cover ``sms``
    SMs ``TARGET_PROGRAMS_PER_SM`` times, without splits shorter than ``MIN_KEYS_PER_SPLIT``
    keys; 1 means "do not split".

    Inside a CUDA graph ``max_seqlen_k`` is the model's length (the bound every replay
    satisfies), so each captured batch size has one fixed count, decided by the batch size
    alone; each replay's true lengths then decide on the device which splits hold keys
    (``ceil(seq_len / splits)`` keys each, :func:`split_bounds`)."""
    programs = max(1, num_reqs * num_kv_heads)
    wanted = -(-(sms * TARGET_PROGRAMS_PER_SM) // programs)
    by_length = max(1, max_seqlen_k // MIN_KEYS_PER_SPLIT)
    return max(1, min(wanted, by_length, MAX_SPLITS))


def check_num_splits(num_splits: int) -> None:
    """Refuse a split count the merge cannot take: it loads ``next_pow2(MAX_SPLITS)`` splits in
    one tile, so the partials of any split past that would be dropped (wrong attention, no
    error). The chooser never goes past it; a forced count (``decode_splits``) could."""
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(
            f"decode splits must be 1 to {MAX_SPLITS} (MAX_SPLITS: the merge kernel loads at "
            f"most that many), got {num_splits}"
        )


def split_bounds(seq_len: int, num_splits: int) -> list[tuple[int, int]]:
    """The key range ``[start, end)`` each split of a ``seq_len``-key request covers, as the
    kernel computes it on the device (empty ranges where ``start >= end``)."""
    per_split = -(-seq_len // num_splits)
    return [(min(s * per_split, seq_len), min((s + 1) * per_split, seq_len))
            for s in range(num_splits)]  # fmt: skip


@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _split_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, partial_ptr, lse_ptr,
    cu_seqlens_q_ptr, seq_lens_ptr, block_tables_ptr,
    num_splits, scale_log2,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, M_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    tok = tl.load(cu_seqlens_q_ptr + req).to(tl.int64)
    q_len = tl.load(cu_seqlens_q_ptr + req + 1) - tok
    seq_len = tl.load(seq_lens_ptr + req)

    # This split's keys: ceil(seq_len / num_splits) of them (split_bounds), not whole tiles.
    per_split = tl.cdiv(seq_len, num_splits)
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    end = tl.where(q_len > 0, end, start)  # a request without a row has nothing to attend

    g = tl.arange(0, M_PAD)
    heads = tl.where(q_len > 0, GROUP, 0)  # scalar folded into the bound (interpreter-safe)
    row_valid = g < heads
    head = kv_head * GROUP + g
    d = tl.arange(0, DIM_PAD)
    d_valid = d < HEAD_DIM
    q_ptrs = q_ptr + tok * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)

    m_i = tl.full([M_PAD], NEG_BIG, tl.float32)
    l_i = tl.zeros([M_PAD], tl.float32)
    acc = tl.zeros([M_PAD, DIM_PAD], tl.float32)
    for n_start in range(start, end, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        n_valid = n < end
        block = tl.load(
            block_tables_ptr + req.to(tl.int64) * stride_bt + n // KV_BLOCK_SIZE,
            mask=n_valid,
            other=0,
        ).to(tl.int64)
        offset = n % KV_BLOCK_SIZE
        k_ptrs = (k_cache_ptr + block[None, :] * stride_kb + offset[None, :] * stride_ks
                  + kv_head * stride_kh + d[:, None])  # fmt: skip
        k = tl.load(k_ptrs, mask=n_valid[None, :] & d_valid[:, None], other=0.0)
        # V depends on the block table only: issued here, its round trip overlaps K's.
        v_ptrs = (v_cache_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs
                  + kv_head * stride_vh + d[None, :])  # fmt: skip
        v = tl.load(v_ptrs, mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        s = attention_dot(q, k, DOT_PRECISION) * scale_log2
        s = tl.where(n_valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + attention_dot(p.to(v.dtype), v, DOT_PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    # partial [tokens, NUM_HEADS, num_splits, DIM_PAD] and lse [tokens, NUM_HEADS, num_splits]
    slot = (tok * NUM_HEADS + head) * num_splits + split
    tl.store(lse_ptr + slot, lse, mask=row_valid)
    tl.store(partial_ptr + slot[:, None] * DIM_PAD + d[None, :], out, mask=row_valid[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _split_merge_kernel(
    partial_ptr, lse_ptr, out_ptr, num_splits,
    stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    s_valid = s < num_splits
    base = (tok * NUM_HEADS + head) * num_splits
    lse = tl.load(lse_ptr + base + s, mask=s_valid, other=float("-inf"))
    m = tl.maximum(tl.max(lse, axis=0), NEG_BIG)  # all -inf (no keys): weights are 0
    w = tl.exp2(lse - m)
    d = tl.arange(0, DIM_PAD)
    parts = tl.load(
        partial_ptr + (base + s)[:, None] * DIM_PAD + d[None, :], mask=s_valid[:, None], other=0.0
    )
    total = tl.sum(w, axis=0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    o_ptrs = out_ptr + tok * stride_ot + head * stride_oh + d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def split_partials(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    num_splits: int,
    block_n: int,
    block_tables: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first launch alone: each split's normalized output ``[tokens, heads, num_splits,
    DIM_PAD]`` (fp32) and its log2-sum-exp of scaled scores ``[tokens, heads, num_splits]``
    (``-inf`` for a split without keys)."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    dim_pad = max(MIN_DOT, next_pow2(head_dim))
    # fp32 partials: the merge must not round each split's output to the model dtype first.
    partial = torch.empty(
        num_tokens, num_heads, num_splits, dim_pad, dtype=torch.float32, device=query.device
    )
    lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=query.device)
    is_fp32 = query.dtype == torch.float32
    launch(
        _split_decode_kernel, (metadata.num_reqs, num_kv_heads, num_splits),
        query, k_cache, v_cache, partial, lse,
        metadata.cu_seqlens_q, metadata.seq_lens, block_tables,
        num_splits, scale * LOG2_E,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        NUM_HEADS=num_heads, GROUP=group, M_PAD=max(MIN_DOT, next_pow2(group)),
        HEAD_DIM=head_dim, DIM_PAD=dim_pad, BLOCK_N=block_n, KV_BLOCK_SIZE=metadata.block_size,
        DOT_PRECISION=dot_precision(query.dtype), num_warps=NUM_WARPS,
        **({"num_stages": 1} if is_fp32 else {}),
    )  # fmt: skip
    return partial, lse


def split_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    num_splits: int,
    block_n: int,
    block_tables: torch.Tensor,
) -> torch.Tensor:
    """Attention for a batch whose requests have at most one row each (``max_seqlen_q <= 1``);
    ``block_tables`` has unit column stride. Two launches: splits, then the merge."""
    check_num_splits(num_splits)
    partial, lse = split_partials(
        query, k_cache, v_cache, metadata, scale, num_splits, block_n, block_tables
    )
    num_tokens, num_heads, head_dim = query.shape
    dim_pad = partial.shape[-1]
    out = torch.empty_like(query)
    launch(
        _split_merge_kernel, (num_tokens, num_heads),
        partial, lse, out, num_splits, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
        SPLITS_PAD=next_pow2(MAX_SPLITS), num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
