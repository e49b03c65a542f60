"""``reference``: the obviously correct oracle. Slow on purpose: one request at a time."""

from __future__ import annotations

import torch

from .backend import AttentionBackend, check_shapes
from .metadata import AttentionMetadata


def gather_request_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """One request's first ``seq_len`` tokens from a paged cache -> ``[seq_len, kv_heads, dim]``."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = block_table_row[:num_blocks].long()
    return cache[blocks].reshape(num_blocks * block_size, *cache.shape[2:])[:seq_len]


def bottom_right_causal_mask(q_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """``[q_len, seq_len]`` bool, True where row ``j`` (the last ``q_len`` positions) may attend."""
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (seq_len - q_len)
    keys = torch.arange(seq_len, device=device).unsqueeze(0)
    return keys <= rows


class ReferenceBackend(AttentionBackend):
    name = "reference"

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        _, group = check_shapes(query, k_cache, v_cache, metadata)
        out = torch.zeros_like(query)
        cu_q = metadata.cu_seqlens_q.tolist()
        seq_lens = metadata.seq_lens.tolist()
        for i, seq_len in enumerate(seq_lens):
            start, end = cu_q[i], cu_q[i + 1]
            q_len = end - start
            if q_len == 0:
                continue
            if q_len > seq_len:
                raise ValueError(f"request {i}: {q_len} new rows but only {seq_len} keys")
            table = metadata.block_tables[i]
            k = gather_request_kv(k_cache, table, seq_len).repeat_interleave(group, dim=1)
            v = gather_request_kv(v_cache, table, seq_len).repeat_interleave(group, dim=1)
            q = query[start:end].float()
            scores = torch.einsum("qhd,khd->hqk", q, k.float()) * scale
            mask = bottom_right_causal_mask(q_len, seq_len, query.device)
            scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[start:end] = torch.einsum("hqk,khd->qhd", probs, v.float()).to(query.dtype)
        return out
