"""``triton``: one paged-attention kernel for mixed prefill and decode rows, and a KV store kernel.

Work split: a program owns up to ``BLOCK_Q`` consecutive query rows of one request and one kv
head, together with all ``group`` query heads that share that kv head (GQA), so each K/V tile it
loads serves ``BLOCK_Q * group`` query rows. Those rows form the tile's M dimension: row
``m`` is token ``m // GROUP_PAD`` and head ``m % GROUP_PAD`` of the group.

Finding the request: request ``r`` is given the programs ``[start(r), start(r + 1))`` with
``start(r) = cu_seqlens_q[r] // BLOCK_Q + r``. That range holds at least ``ceil(q_len_r /
BLOCK_Q)`` programs (the extra ones exit with nothing to do), ``start`` is increasing, and the
whole grid is ``num_tokens // BLOCK_Q + num_reqs`` programs, known on the host without reading
any device tensor (so no sync, and CUDA-graph friendly). Each program binary-searches ``start``.

Pure-decode batches go to decode kernels of their own: the split-K kernels of
:mod:`.triton_decode_split` when few requests would leave most SMs idle (long contexts), else
the GQA-packed kernel of :mod:`.triton_decode_packed` (one program per request and kv head,
the group's heads as its rows; ``decode_kernel="unified"`` keeps this kernel for decode too).

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, so whether this module runs compiled
(CUDA tensors) or interpreted (CPU tensors) is fixed at import time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import AttentionBackend, check_shapes
from .metadata import AttentionMetadata
from .triton_common import INTERPRETED, check_device, launch, next_pow2
from .triton_decode_packed import packed_decode_attention
from .triton_decode_split import (
    check_num_splits,
    num_kv_splits,
    num_sms,
    split_decode_attention,
)
from .triton_dot import LOG2_E, MIN_DOT, NEG_BIG, attention_dot, dot_precision

DECODE_KERNELS = ("packed", "packed-cores", "unified")
# Below this head dim pure decodes keep the unified kernel: under Triton 3.6 (the GPU image's)
# the packed tensor-core tile at head dim 64 spills 8 bytes on sm_90 with 16-token blocks
# (tests/kernels/test_triton_aot.py), and a 64-wide head gains least from packing.
PACKED_MIN_HEAD_DIM = 128


@dataclass(frozen=True)
class TileConfig:
    """Query-tile rows (tokens x group heads) per program: small keeps decode waste low, large
    reuses each K/V tile across more prefill rows. ``block_n``: keys per inner-loop tile.
    ``block_n_split``: the split-K kernel's keys per iteration; its programs are few and each
    is a chain of dependent loads, so it takes more keys a step (a shorter chain) where the
    compile allows (tests/kernels/test_triton_aot.py)."""

    rows_decode: int = 16
    rows_prefill: int = 32
    block_n: int = 64
    block_n_split: int = 64


# The GPU's tiles, sized so no sm_80/sm_90 compile spills registers under Triton 3.6 or 3.9
# (tests/kernels/test_triton_aot.py: 64 query rows x 64 keys spilled at head dim 128). fp32 computes its
# dots exactly (FMA, not tensor cores), which needs far more registers per tile: smaller tiles.
GPU_TILES = TileConfig(rows_decode=16, rows_prefill=32, block_n=64, block_n_split=128)
GPU_FP32_TILES = TileConfig(rows_decode=16, rows_prefill=16, block_n=16, block_n_split=16)
# The interpreter pays per program and per tile step, so it gets bigger query tiles; its
# smaller key tiles keep the tests' short sequences spanning several tiles (online softmax gets
# exercised). tests/kernels/test_kernels_gpu_tiles.py runs the GPU's tiles interpreted too.
INTERPRETER_TILES = TileConfig(rows_decode=16, rows_prefill=128, block_n=32, block_n_split=32)


def default_tiles(dtype: torch.dtype) -> TileConfig:
    if INTERPRETED:
        return INTERPRETER_TILES
    return GPU_FP32_TILES if dtype == torch.float32 else GPU_TILES


NUM_WARPS = 4
# Shared-memory budget: head dims above this get half-size tiles, and fp32 is not software
# pipelined, so the worst cases stay under ~100 KB (sm_86/89 limit; checked by compiling).
WIDE_HEAD_DIM = 128
FP32_NUM_STAGES = 1


@triton.jit(do_not_specialize=["num_reqs", "stride_bt"])
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    cu_seqlens_q_ptr, seq_lens_ptr, block_tables_ptr,
    num_reqs, scale_log2,
    stride_qt, stride_qh, stride_qd,
    stride_ot, stride_oh, stride_od,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    # Largest r with start(r) <= pid; start(0) == 0 so r >= 0.
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0, tl.int32) + num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        start_mid = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        go_right = start_mid <= pid
        lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(go_right, hi, mid)
    req = lo - 1

    req_q_start = tl.load(cu_seqlens_q_ptr + req)
    req_q_end = tl.load(cu_seqlens_q_ptr + req + 1)
    seq_len = tl.load(seq_lens_ptr + req)
    q_len = req_q_end - req_q_start
    local_block = pid - (req_q_start // BLOCK_Q + req)
    first_local = local_block * BLOCK_Q  # first row of this program, within the request

    m_idx = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok_local = first_local + m_idx // GROUP_PAD
    g = m_idx % GROUP_PAD
    row_valid = (tok_local < q_len) & (g < GROUP)
    head = kv_head * GROUP + g
    # Bottom-right alignment: local row j is sequence position seq_len - q_len + j.
    q_pos = seq_len - q_len + tok_local

    d = tl.arange(0, DIM_PAD)
    d_valid = d < HEAD_DIM
    tok = (req_q_start + tok_local).to(tl.int64)
    q_ptrs = q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)

    m_i = tl.full([BLOCK_Q * GROUP_PAD], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, DIM_PAD], tl.float32)

    # Keys this program can see: up to its last valid row's position (0 when it has no rows).
    last_local = tl.minimum(first_local + BLOCK_Q, q_len) - 1
    kv_end = tl.where(first_local < q_len, seq_len - q_len + last_local + 1, 0)
    for n_start in range(0, kv_end, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        n_valid = n < kv_end
        block = tl.load(
            block_tables_ptr + req.to(tl.int64) * stride_bt + n // KV_BLOCK_SIZE,
            mask=n_valid,
            other=0,
        ).to(tl.int64)
        offset = n % KV_BLOCK_SIZE
        kv_mask = n_valid[None, :] & d_valid[:, None]
        k_ptrs = (k_cache_ptr + block[None, :] * stride_kb + offset[None, :] * stride_ks
                  + kv_head * stride_kh + d[:, None] * stride_kd)  # fmt: skip
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)  # [DIM_PAD, BLOCK_N]
        s = attention_dot(q, k, DOT_PRECISION) * scale_log2  # log2 domain
        visible = (n[None, :] <= q_pos[:, None]) & n_valid[None, :]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_ptrs = (v_cache_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs
                  + kv_head * stride_vh + d[None, :] * stride_vd)  # fmt: skip
        v = tl.load(v_ptrs, mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        acc = acc * alpha[:, None] + attention_dot(p.to(v.dtype), v, DOT_PRECISION)
        m_i = m_new

    l_i = tl.where(l_i > 0.0, l_i, 1.0)  # rows without keys are padding; avoid 0/0
    out = acc / l_i[:, None]
    o_ptrs = out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + row).to(tl.int64)
    block = slot // KV_BLOCK_SIZE
    offset = slot % KV_BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, DIM_PAD)[None, :]
    # A negative slot is a padding row: copy no heads. (Folding the test into the head bound
    # also sidesteps the interpreter rejecting `tensor_mask & scalar_mask`.)
    num_heads = tl.where(slot >= 0, NUM_KV_HEADS, 0)
    mask = (h < num_heads) & (d < HEAD_DIM)
    k = tl.load(key_ptr + row * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(value_ptr + row * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d * stride_kcd
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d * stride_vcd
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


class TritonBackend(AttentionBackend):
    """``tiles``: tile sizes (default: ``default_tiles(dtype)``). ``sms``: SMs
    to fill when choosing split-K (default: the device's). ``decode_splits``: force a split
    count for pure-decode batches (tests), 1 to ``MAX_SPLITS``; ``None`` chooses, 1 never splits.
    ``decode_kernel``: the kernel of unsplit pure-decode batches, "packed" (GQA-packed on tensor
    cores, the default), "packed-cores" (GQA-packed on CUDA cores, no padding rows) or
    "unified" (this module's mixed kernel, as before it)."""

    name = "triton"

    def __init__(
        self,
        tiles: TileConfig | None = None,
        sms: int | None = None,
        decode_splits: int | None = None,
        decode_kernel: str = "packed",
    ) -> None:
        if decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel must be one of {DECODE_KERNELS}, not {decode_kernel!r}")
        if decode_splits is not None:
            check_num_splits(decode_splits)
        self.tiles = tiles
        self.sms = sms
        self.decode_splits = decode_splits
        self.decode_kernel = decode_kernel

    def choose_decode_splits(self, metadata: AttentionMetadata, num_kv_heads: int, device) -> int:
        """Splits for a pure-decode batch, from host-side values only (graph-capture safe)."""
        if self.decode_splits is not None:
            return self.decode_splits
        sms = self.sms if self.sms is not None else num_sms(torch.device(device))
        return num_kv_splits(metadata.num_reqs, num_kv_heads, metadata.max_seqlen_k, sms)

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        check_device(key.device)
        num_tokens, num_kv_heads, head_dim = key.shape
        if num_tokens == 0:
            return
        launch(
            _store_kv_kernel, (num_tokens,),
            key, value, k_cache, v_cache, slot_mapping,
            *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
            NUM_KV_HEADS=num_kv_heads, HEADS_PAD=next_pow2(num_kv_heads),
            HEAD_DIM=head_dim, DIM_PAD=next_pow2(head_dim), KV_BLOCK_SIZE=k_cache.shape[1],
        )  # fmt: skip

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        num_kv_heads, group = check_shapes(query, k_cache, v_cache, metadata)
        check_device(query.device)
        if query.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
            raise ValueError(
                f"triton needs one dtype for query and caches, got {query.dtype}, "
                f"{k_cache.dtype}, {v_cache.dtype}"
            )
        if metadata.num_tokens == 0 or metadata.num_reqs == 0:
            return torch.empty_like(query)
        block_tables = metadata.block_tables
        if block_tables.stride(-1) != 1:  # the kernel indexes table columns with stride 1
            block_tables = block_tables.contiguous()
        head_dim = query.shape[2]
        dim_pad = max(MIN_DOT, next_pow2(head_dim))
        group_pad = next_pow2(group)
        tiles = self.tiles or default_tiles(query.dtype)
        rows = tiles.rows_decode if metadata.max_seqlen_q <= 1 else tiles.rows_prefill
        block_n, block_n_split = tiles.block_n, tiles.block_n_split
        if dim_pad > WIDE_HEAD_DIM:
            rows, block_n = max(MIN_DOT, rows // 2), max(MIN_DOT, block_n // 2)
            block_n_split = max(MIN_DOT, block_n_split // 2)
        contiguous_dims = query.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
        if metadata.max_seqlen_q <= 1 and contiguous_dims:
            splits = self.choose_decode_splits(metadata, num_kv_heads, query.device)
            if splits > 1:
                return split_decode_attention(
                    query, k_cache, v_cache, metadata, scale, splits, block_n_split, block_tables
                )
            if self.decode_kernel != "unified" and dim_pad >= PACKED_MIN_HEAD_DIM:
                return packed_decode_attention(
                    query, k_cache, v_cache, metadata, scale, block_n, block_tables,
                    cores=self.decode_kernel == "packed-cores",
                )
        block_q = max(1, rows // group_pad, MIN_DOT // group_pad)
        grid = (metadata.num_tokens // block_q + metadata.num_reqs, num_kv_heads)
        is_fp32 = query.dtype == torch.float32
        precision = dot_precision(query.dtype)  # bf16 interpreted: fp32 dots (triton_dot.py)
        options = {"num_warps": NUM_WARPS}
        if is_fp32:
            options["num_stages"] = FP32_NUM_STAGES
        out = torch.empty_like(query)
        launch(
            _paged_attention_kernel, grid,
            query, k_cache, v_cache, out,
            metadata.cu_seqlens_q, metadata.seq_lens, block_tables,
            metadata.num_reqs, scale * LOG2_E,
            *query.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(),
            block_tables.stride(0),
            GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
            BLOCK_Q=block_q, BLOCK_N=block_n, KV_BLOCK_SIZE=metadata.block_size,
            DOT_PRECISION=precision, **options,
        )  # fmt: skip
        return out
