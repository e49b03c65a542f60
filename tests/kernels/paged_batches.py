"""Paged-attention test batches shared by the kernel tests: random caches, shuffled block tables,
garbage in every block no request owns, and the dense and backend results to compare."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cbbench.kernels import (
    AttentionMetadata,
    build_metadata,
    get_backend,
)

HAS_CUDA = torch.cuda.is_available()
TRITON_DEVICE = "cuda" if HAS_CUDA else "cpu"  # compiled on a GPU, interpreted on the CPU
NUM_KV_HEADS = 2
HEAD_DIM = 32
SPARE_BLOCKS = 3  # blocks no request owns: filled with garbage
ATOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def batch_shapes(case: str, block_size: int) -> tuple[list[int], list[int]]:
    """(query_lens, context_lens) for a named batch; lengths are relative to the block size so
    both block sizes hit a block boundary exactly."""
    b = block_size
    if case == "prefill":  # a 1-token prompt, one exactly a block long, one ragged
        return [1, b, 23], [0, 0, 0]
    if case == "decode":  # 1 key, a full block, two full blocks, ragged
        return [1, 1, 1, 1], [0, b - 1, 2 * b - 1, b + 9]
    if case == "chunked":  # chunks after cached context; the second ends on a block boundary
        return [7, 5], [9, 2 * b - 5]
    if case == "mixed":  # decodes (one over a single cached token), a prompt, a chunk
        return [1, 6, 1, 11, 1, 1], [b + 3, 0, 4, b - 11, 0, 1]
    raise ValueError(case)


CASES = ("prefill", "decode", "chunked", "mixed")


@dataclass
class Batch:
    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    metadata: AttentionMetadata
    keys: list[torch.Tensor]  # unpaged per-request K [seq_len, kv_heads, dim]
    values: list[torch.Tensor]
    context_lens: list[int]


def make_batch(
    query_lens: list[int],
    context_lens: list[int],
    block_size: int,
    gqa: int,
    dtype: torch.dtype,
    device: str = "cpu",
    seed: int = 0,
    head_dim: int = HEAD_DIM,
    num_kv_heads: int = NUM_KV_HEADS,
) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    blocks_needed = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + SPARE_BLOCKS
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables, start = [], 0
    for n in blocks_needed:
        tables.append(ids[start : start + n])
        start += n

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen) * 10  # garbage everywhere first
    v_cache = torch.randn(shape, generator=gen) * 10
    keys, values = [], []
    for seq_len, table in zip(seq_lens, tables, strict=True):
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
        for t in range(seq_len):  # scatter token by token: independent of any backend
            k_cache[table[t // block_size], t % block_size] = k[t]
            v_cache[table[t // block_size], t % block_size] = v[t]
        keys.append(k.to(dtype))
        values.append(v.to(dtype))
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_kv_heads * gqa, head_dim, generator=gen)
    metadata = build_metadata(query_lens, context_lens, tables, block_size, device=device)
    return Batch(
        query=query.to(device=device, dtype=dtype),
        k_cache=k_cache.to(device=device, dtype=dtype),
        v_cache=v_cache.to(device=device, dtype=dtype),
        metadata=metadata,
        keys=[k.to(device) for k in keys],
        values=[v.to(device) for v in values],
        context_lens=list(context_lens),
    )


def dense_attention(batch: Batch, scale: float) -> torch.Tensor:
    """Per-request causal attention from the unpaged K/V in float64, masked by absolute position
    (query row j of a request sits at position context_len + j)."""
    out = torch.zeros(batch.query.shape, dtype=torch.float64, device=batch.query.device)
    cu = batch.metadata.cu_seqlens_q.tolist()
    num_heads = batch.query.shape[1]
    for i, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True)):
        q = batch.query[cu[i] : cu[i + 1]].double()
        for h in range(num_heads):
            kv_head = h // (num_heads // k.shape[1])
            scores = q[:, h] @ k[:, kv_head].double().T * scale
            q_pos = batch.context_lens[i] + torch.arange(q.shape[0], device=q.device)
            k_pos = torch.arange(k.shape[0], device=q.device)
            scores[k_pos[None, :] > q_pos[:, None]] = float("-inf")
            out[cu[i] : cu[i + 1], h] = torch.softmax(scores, -1) @ v[:, kv_head].double()
    return out


def run_backend(name: str, batch: Batch, scale: float) -> torch.Tensor:
    backend = get_backend(name, batch.query.device, block_size=batch.metadata.block_size)
    out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, scale)
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    return out


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(
        actual.double(), expected.double(), atol=ATOL[dtype], rtol=0.0, check_device=False
    )
