"""``torch``: vectorized pure-PyTorch paged attention, the CPU engine's default.

Single-row requests (decodes, and 1-token chunks, which are the same maths) are served together
by one batched gather over their block tables, padded to the longest key length and masked.
Multi-row requests (prefill chunks) go one at a time through ``scaled_dot_product_attention``.

On a CPU the decode rows are sorted by length and cut into buckets whose gathered keys fit in
a core's cache (``DECODE_BUCKET_BYTES``): the gather's copy is then still cached when SDPA reads
it. Measured on this project's 2-core EPYC host ('small' preset, 256 decode rows of 50-1500
keys): ~2x faster than 32-row buckets of any size (and index_select for the gather ~1.7x more).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backend import AttentionBackend, check_shapes
from .metadata import AttentionMetadata, host_lengths, query_lens_of
from .reference import bottom_right_causal_mask

# Decode rows per padded gather: small enough that sorted buckets pad little, large enough
# that per-call overhead stays small.
DECODE_BUCKET_ROWS = 32
# On a CPU also at most this many bytes of gathered keys per bucket (and as many of values):
# about one core's L2 (1 MiB per core here; 512 KiB-2 MiB on current x86 server cores), so
# SDPA reads the copy from cache. Measured ('small', 100 and 256 rows of 50-1500 keys): 1 and
# 2 MiB tied best; 512 KiB 1.2x slower, 4 MiB 1.1-1.5x, 8 MiB 1.3-2.3x, no cap 1.7-2.7x.
DECODE_BUCKET_BYTES = 2 * 1024**2


class TorchBackend(AttentionBackend):
    name = "torch"

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        check_shapes(query, k_cache, v_cache, metadata)
        if metadata.num_tokens == 0:
            return torch.empty_like(query)
        if metadata.max_seqlen_q <= 1:
            # Pure decode: no host sync needed. Row r belongs to request r unless some requests
            # have no rows at all (then map rows to requests on the device).
            if query.device.type == "cpu" and metadata.num_tokens == metadata.num_reqs:
                return _planned_single_rows(query, k_cache, v_cache, metadata, scale)
            reqs = torch.arange(metadata.num_reqs, device=query.device)
            if metadata.num_tokens != metadata.num_reqs:
                reqs = torch.repeat_interleave(
                    reqs, query_lens_of(metadata), output_size=metadata.num_tokens
                )
            return _single_row_attention(
                query, k_cache, v_cache, metadata, reqs, metadata.max_seqlen_k, scale
            )

        out = torch.empty_like(query)
        lengths = host_lengths(metadata)  # synced once per forward, not per layer
        q_lens, cu_q, seq_lens = lengths.query_lens, lengths.cu_seqlens_q, lengths.seq_lens
        if any(n == 1 for n in q_lens):
            plan = _decode_plan(metadata, k_cache, mixed=True)
            out.index_copy_(0, plan.rows, _attend_plan(query, k_cache, v_cache, plan, scale))
        for i, q_len in enumerate(q_lens):
            if q_len > 1:
                start, end = cu_q[i], cu_q[i + 1]
                out[start:end] = _multi_row_attention(
                    query[start:end], k_cache, v_cache, metadata.block_tables[i], seq_lens[i], scale
                )
        return out


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``cache[blocks]`` for a 1-D int32/int64 ``blocks``: ``[len(blocks), block_size, ...]``.

    ``index_select`` copies each block as one contiguous run; advanced indexing (``cache[t]``)
    goes through the generic index kernel and was measured ~3x slower on a CPU for the same
    copy (and the decode gather is most of the CPU engine's forward)."""
    return cache.index_select(0, blocks)


def _buckets(order: list[int], seq_lens: list[int], k_cache: torch.Tensor) -> list[list[int]]:
    """``order`` (request indices sorted by key count) cut into consecutive buckets of at most
    DECODE_BUCKET_ROWS rows and, on a CPU, at most DECODE_BUCKET_BYTES of padded keys (never
    less than one row)."""
    if k_cache.device.type != "cpu":
        return [order[b : b + DECODE_BUCKET_ROWS] for b in range(0, len(order), DECODE_BUCKET_ROWS)]
    block_size = k_cache.shape[1]
    key_bytes = k_cache[0, 0].numel() * k_cache.element_size()
    buckets, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and end - start < DECODE_BUCKET_ROWS:
            padded = -(-seq_lens[order[end]] // block_size) * block_size  # the new longest
            if (end + 1 - start) * padded * key_bytes > DECODE_BUCKET_BYTES:
                break
            end += 1
        buckets.append(order[start:end])
        start = end
    return buckets


@dataclass(frozen=True)
class _Bucket:
    """One padded gather: sorted rows ``start:end`` (positions in ``_DecodePlan.rows``)."""

    start: int
    end: int
    blocks: torch.Tensor  # [rows * max_blocks]: each row's block table, padded to the longest
    # [rows, 1, 1, max_blocks * block_size]: 0 on a row's real keys, -inf on its padding (what
    # SDPA would turn a boolean mask into, for every layer and bucket, done once per forward)
    bias: torch.Tensor


@dataclass(frozen=True)
class _DecodePlan:
    """The single rows of one forward, sorted by key count and cut into buckets. Every layer of
    a forward has the same lengths and block tables, so the plan is built once per metadata
    object and each layer only gathers and attends."""

    key: tuple  # (block_size, bytes per key, dtype, mixed): what the plan depends on
    rows: torch.Tensor  # int64 [n]: the query rows, sorted by key count
    unsort: torch.Tensor  # int64 [n]: pure decode only, position of row r in ``rows``
    buckets: list[_Bucket]


def _decode_plan(metadata: AttentionMetadata, k_cache: torch.Tensor, mixed: bool) -> _DecodePlan:
    """The plan for ``metadata``'s single rows (every row of a pure decode, where row r is
    request r; the 1-row requests of a mixed batch), cached on the metadata object like
    :func:`host_lengths` (its tensors are not modified after it is built)."""
    block_size = k_cache.shape[1]
    key = (block_size, k_cache[0, 0].numel() * k_cache.element_size(), k_cache.dtype, mixed)
    cached = metadata.__dict__.get("_decode_plan")
    if cached is not None and cached.key == key:
        return cached
    lengths = host_lengths(metadata)
    seq_lens = lengths.seq_lens
    reqs = (
        [i for i, n in enumerate(lengths.query_lens) if n == 1] if mixed else range(len(seq_lens))
    )
    order = sorted(reqs, key=seq_lens.__getitem__)
    device = metadata.block_tables.device
    order_t = torch.tensor(order, dtype=torch.int64, device=device)
    rows = (
        torch.tensor([lengths.cu_seqlens_q[i] for i in order], dtype=torch.int64, device=device)
        if mixed
        else order_t
    )
    tables = metadata.block_tables.index_select(0, order_t)
    lens = metadata.seq_lens.index_select(0, order_t).unsqueeze(1)
    buckets, start = [], 0
    for bucket in _buckets(order, seq_lens, k_cache):
        end = start + len(bucket)
        max_blocks = max(1, -(-seq_lens[bucket[-1]] // block_size))
        blocks = tables[start:end, :max_blocks]
        key_pos = torch.arange(blocks.shape[1] * block_size, device=device)
        valid = key_pos.unsqueeze(0) < lens[start:end]
        bias = torch.zeros(valid.shape, dtype=k_cache.dtype, device=device)
        bias.masked_fill_(valid.logical_not(), float("-inf"))
        buckets.append(_Bucket(start, end, blocks.reshape(-1), bias[:, None, None, :]))
        start = end
    unsort = torch.empty_like(order_t)
    if not mixed:  # rows are requests 0..n-1 here: a permutation
        unsort[order_t] = torch.arange(len(order), device=device)
    plan = _DecodePlan(key, rows, unsort, buckets)
    object.__setattr__(metadata, "_decode_plan", plan)  # a cache, not a field
    return plan


def _attend_plan(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: _DecodePlan,
    scale: float,
) -> torch.Tensor:
    """The plan's rows attended, in the plan's (sorted) order: ``[n, heads, head_dim]``."""
    q_sorted = query.index_select(0, plan.rows)  # one copy; each bucket is then a slice
    out = torch.empty_like(q_sorted)
    for b in plan.buckets:
        out[b.start : b.end] = _attend_rows(
            q_sorted[b.start : b.end], k_cache, v_cache, b.blocks, b.bias, scale
        )
    return out


def _planned_single_rows(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Pure decode on the CPU: one padded gather over all rows would pad every row to the
    longest history (ShareGPT's max/mean is ~4x); sorting by length and padding per bucket of
    similar lengths reads only a little more than the real keys. The host sync this needs is
    free on a CPU."""
    plan = _decode_plan(metadata, k_cache, mixed=False)
    return _attend_plan(query, k_cache, v_cache, plan, scale).index_select(0, plan.unsort)


def _single_row_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    reqs: torch.Tensor,
    max_len: int,
    scale: float,
) -> torch.Tensor:
    """Rows that are the last position of request ``reqs[r]``: each attends all its keys.

    ``max_len`` bounds those requests' key counts (the padded gather length)."""
    block_size = k_cache.shape[1]
    max_blocks = max(1, -(-max_len // block_size))
    blocks = metadata.block_tables[reqs, :max_blocks]  # [rows, max_blocks]
    key_pos = torch.arange(blocks.shape[1] * block_size, device=query.device)
    valid = key_pos.unsqueeze(0) < metadata.seq_lens[reqs].unsqueeze(1)  # [rows, keys]
    return _attend_rows(
        query, k_cache, v_cache, blocks.reshape(-1), valid[:, None, None, :], scale
    )


def _attend_rows(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    blocks: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Single rows over their padded gather: ``blocks`` holds each row's ``max_blocks`` block
    ids (``[rows * max_blocks]``), ``mask`` (``[rows, 1, 1, keys]``, SDPA's boolean or additive
    mask) its real keys."""
    num_rows, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # One gather per cache, padded to the longest row; the padding is masked out below.
    # transpose() is a view: SDPA reads the strided [rows, kv_heads, keys, dim] layout directly.
    keys, values = (
        gather_blocks(cache, blocks).view(num_rows, -1, num_kv_heads, head_dim).transpose(1, 2)
        for cache in (k_cache, v_cache)
    )
    # GQA: the group's heads are the "query rows" of their kv head: [rows, kv_heads, group, dim].
    q = query.reshape(num_rows, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(num_rows, num_heads, head_dim)


def _multi_row_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table_row: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """One request's ``q_len`` rows, the last positions of its ``seq_len`` keys."""
    q_len, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if q_len > seq_len:
        raise ValueError(f"{q_len} new rows but only {seq_len} keys")
    blocks = block_table_row[: -(-seq_len // k_cache.shape[1])]
    # [kvh, L, d]
    keys = gather_blocks(k_cache, blocks).flatten(0, 1)[:seq_len].transpose(0, 1)
    values = gather_blocks(v_cache, blocks).flatten(0, 1)[:seq_len].transpose(0, 1)
    # GQA without copying K/V per query head: [kvh, group, ...] with K/V expanded (stride 0) over
    # the group. (Measured on CPU: much faster than folding the group into the query rows.)
    q = query.reshape(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    shape = (num_kv_heads, group, seq_len, head_dim)
    keys, values = keys[:, None].expand(shape), values[:, None].expand(shape)
    if q_len == seq_len:
        # No cached context: top-left and bottom-right alignment coincide.
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale)
    else:
        mask = bottom_right_causal_mask(q_len, seq_len, query.device)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim)
