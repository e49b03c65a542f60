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
            reqs = torch.arange(metadata.num_reqs, device=query.device)
            if metadata.num_tokens != metadata.num_reqs:
                reqs = torch.repeat_interleave(
                    reqs, query_lens_of(metadata), output_size=metadata.num_tokens
                )
            if query.device.type == "cpu" and metadata.num_tokens == metadata.num_reqs:
                return _bucketed_single_rows(query, k_cache, v_cache, metadata, scale)
            return _single_row_attention(
                query, k_cache, v_cache, metadata, reqs, metadata.max_seqlen_k, scale
            )

        out = torch.empty_like(query)
        lengths = host_lengths(metadata)  # synced once per forward, not per layer
        q_lens, cu_q, seq_lens = lengths.query_lens, lengths.cu_seqlens_q, lengths.seq_lens
        single = [i for i, n in enumerate(q_lens) if n == 1]
        if single:
            # Sorted by key length and cut into buckets, so each padded gather pads little.
            single.sort(key=seq_lens.__getitem__)
            for bucket in _buckets(single, seq_lens, k_cache):
                reqs = torch.tensor(bucket, device=query.device)
                rows = torch.tensor([cu_q[i] for i in bucket], device=query.device)
                out[rows] = _single_row_attention(
                    query[rows], k_cache, v_cache, metadata, reqs, seq_lens[bucket[-1]], scale
                )
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


def _bucketed_single_rows(
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
    seq_lens = host_lengths(metadata).seq_lens
    order = sorted(range(len(seq_lens)), key=seq_lens.__getitem__)
    out = torch.empty_like(query)
    for bucket in _buckets(order, seq_lens, k_cache):
        reqs = torch.tensor(bucket, device=query.device)
        out[reqs] = _single_row_attention(
            query[reqs], k_cache, v_cache, metadata, reqs, seq_lens[bucket[-1]], scale
        )
    return out


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
    num_rows, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_blocks = max(1, -(-max_len // block_size))
    blocks = metadata.block_tables[reqs, :max_blocks].reshape(-1)  # [rows * max_blocks]
    # One gather per cache, padded to the longest request; the padding is masked out below.
    # transpose() is a view: SDPA reads the strided [rows, kv_heads, keys, dim] layout directly.
    keys, values = (
        gather_blocks(cache, blocks).view(num_rows, -1, num_kv_heads, head_dim).transpose(1, 2)
        for cache in (k_cache, v_cache)
    )
    key_pos = torch.arange(keys.shape[2], device=query.device)
    valid = key_pos.unsqueeze(0) < metadata.seq_lens[reqs].unsqueeze(1)  # [rows, keys]
    # GQA: the group's heads are the "query rows" of their kv head: [rows, kv_heads, group, dim].
    q = query.reshape(num_rows, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=valid[:, None, None, :], scale=scale
    )
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
