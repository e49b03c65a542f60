"""The interface every attention backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .metadata import AttentionMetadata


class AttentionBackend(ABC):
    """Paged attention over the layout described in :mod:`.metadata`.

    The caller writes the iteration's new K/V with :meth:`write_kv` first, then calls
    :meth:`forward`, which reads every key (cached and new) from the cache only.
    """

    name: str = ""

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write row ``r`` of ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` at
        flat slot ``slot_mapping[r]`` of the caches; negative slots are skipped."""
        write_kv_torch(key, value, k_cache, v_cache, slot_mapping)

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """``query [num_tokens, num_heads, head_dim]`` -> output of the same shape and dtype.

        GQA: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def write_kv_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Plain-indexing KV write shared by the PyTorch-based backends."""
    block_size = k_cache.shape[1]
    # Boolean masking syncs on CUDA (not CUDA-graph safe); the Triton store kernel is the
    # sync-free path there. Advanced indexing works for any cache strides.
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots % block_size
    k_cache[blocks, offsets] = key[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[valid].to(v_cache.dtype)


def check_shapes(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, metadata: AttentionMetadata
) -> tuple[int, int]:
    """Validate the common shapes; return ``(num_kv_heads, group)`` where group = heads per kv head."""
    if query.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "expected query [tokens, heads, dim] and caches [blocks, block_size, kv_heads, dim], "
            f"got {tuple(query.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"query has {num_heads} heads of {head_dim}; cache has {num_kv_heads} kv heads of "
            f"{k_cache.shape[3]} (heads must be a multiple of kv heads)"
        )
    if k_cache.shape[1] != metadata.block_size:
        raise ValueError(
            f"cache block size {k_cache.shape[1]} != metadata block size {metadata.block_size}"
        )
    if query.shape[0] != metadata.num_tokens:
        raise ValueError(
            f"query has {query.shape[0]} rows but the metadata describes {metadata.num_tokens}"
        )
    return num_kv_heads, num_heads // num_kv_heads
