"""The attention metadata contract shared by every backend.

All new tokens of one engine iteration (prefill chunks and decode rows alike) are packed into
one flat batch of ``num_tokens`` rows, grouped by request: request ``i`` owns rows
``cu_seqlens_q[i]:cu_seqlens_q[i+1]``. Those rows are the *last* ``q_len_i`` positions of a
sequence of ``seq_lens[i]`` keys (its cached context plus the new tokens), so causal masking is
aligned bottom-right: query row ``j`` of request ``i`` (0-based within the request) may attend
keys ``0 .. seq_lens[i] - q_len_i + j``.

Paged KV cache layout, per layer: ``k_cache`` and ``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]`` (flash-attn's paged layout). Token ``t`` of
request ``i`` lives in block ``block_tables[i, t // block_size]`` at offset ``t % block_size``.
``slot_mapping[r] = block * block_size + offset`` is where row ``r``'s new K/V is written; a
negative slot means "do not write" (padding rows, e.g. for CUDA-graph replay).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]: keys per request (context + new tokens)
    max_seqlen_q: int
    max_seqlen_k: int
    block_tables: torch.Tensor  # int32 [num_reqs, max_blocks_per_req]; unused entries are 0
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    block_size: int
    cu_seqlens_k: torch.Tensor | None = None  # int32 [num_reqs + 1]; flash-attn needs it

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


def build_metadata(
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Build the metadata for one packed batch from host-side per-request lists.

    Request ``i`` adds ``query_lens[i]`` new tokens after ``context_lens[i]`` cached ones, so it
    sees ``seq_lens[i] = context_lens[i] + query_lens[i]`` keys. ``block_tables[i]`` lists its
    physical blocks in logical order and must cover ``seq_lens[i]`` tokens; rows are padded with
    block 0 to the longest table. The new rows' slots follow from the block tables.
    """
    if not (len(query_lens) == len(context_lens) == len(block_tables)):
        raise ValueError("query_lens, context_lens and block_tables need one entry per request")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    slots: list[int] = []
    for i, (ctx, seq_len, table) in enumerate(
        zip(context_lens, seq_lens, block_tables, strict=True)
    ):
        if ctx < 0 or seq_len < ctx:
            raise ValueError(f"request {i}: lengths must be non-negative")
        if len(table) * block_size < seq_len:
            raise ValueError(
                f"request {i}: {len(table)} blocks of {block_size} cannot hold {seq_len} tokens"
            )
        slots.extend(
            table[t // block_size] * block_size + t % block_size for t in range(ctx, seq_len)
        )

    max_blocks = max((len(t) for t in block_tables), default=0)
    padded = [list(t) + [0] * (max_blocks - len(t)) for t in block_tables]
    cu_q = [0]
    cu_k = [0]
    for q, s in zip(query_lens, seq_lens, strict=True):
        cu_q.append(cu_q[-1] + q)
        cu_k.append(cu_k[-1] + s)

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return AttentionMetadata(
        cu_seqlens_q=i32(cu_q),
        seq_lens=i32(seq_lens),
        max_seqlen_q=max(query_lens, default=0),
        max_seqlen_k=max(seq_lens, default=0),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(
            len(block_tables), max_blocks
        ),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_size=block_size,
        cu_seqlens_k=i32(cu_k),
    )


def cu_seqlens_k_of(metadata: AttentionMetadata) -> torch.Tensor:
    """``cu_seqlens_k`` from the metadata, derived from ``seq_lens`` when the caller left it out."""
    if metadata.cu_seqlens_k is not None:
        return metadata.cu_seqlens_k
    zero = torch.zeros(1, dtype=torch.int32, device=metadata.seq_lens.device)
    return torch.cat([zero, torch.cumsum(metadata.seq_lens, 0, dtype=torch.int32)])


@dataclass(frozen=True)
class HostLengths:
    """The metadata's per-request lengths as Python lists, for backends that loop on the host."""

    cu_seqlens_q: list[int]
    query_lens: list[int]
    seq_lens: list[int]


def host_lengths(metadata: AttentionMetadata) -> HostLengths:
    """Read the lengths to the host once per metadata object (every layer of a forward shares
    it): one device sync per iteration instead of several per layer. Relies on the contract
    that a metadata object's tensors are not modified after it is built."""
    cached = metadata.__dict__.get("_host_lengths")
    if cached is None:
        cu_q = metadata.cu_seqlens_q.tolist()
        cached = HostLengths(
            cu_seqlens_q=cu_q,
            query_lens=[b - a for a, b in zip(cu_q, cu_q[1:])],
            seq_lens=metadata.seq_lens.tolist(),
        )
        object.__setattr__(metadata, "_host_lengths", cached)  # a cache, not a field
    return cached


def query_lens_of(metadata: AttentionMetadata) -> torch.Tensor:
    """New rows per request (int32 ``[num_reqs]``), on the metadata's device."""
    return metadata.cu_seqlens_q[1:] - metadata.cu_seqlens_q[:-1]
