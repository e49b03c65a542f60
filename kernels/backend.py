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
    """Plain-indexing KV write shared by the PyTorch-based backends.

    On the CPU, boolean masking drops the padding rows (cheap there). Elsewhere a boolean mask
    would sync with the host (its output size depends on the data), three times per layer, and
    break CUDA-graph capture: :func:`write_kv_no_sync` is used instead."""
    if slot_mapping.device.type != "cpu":
        write_kv_no_sync(key, value, k_cache, v_cache, slot_mapping)
        return
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots % block_size
    k_cache[blocks, offsets] = key[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[valid].to(v_cache.dtype)


def write_kv_no_sync(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The KV write with fixed-size index tensors only: nothing reads the device on the host.

    Every row writes. A padding row (negative slot) is redirected on the device to the first
    valid row's slot and writes that row's own new K/V, so the duplicate index writes identical
    values and the result does not depend on the order of the writes; when no row is valid,
    every row writes slot 0's current contents back to it."""
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    rows = torch.arange(num_tokens, device=slot_mapping.device)
    first_valid = torch.argmax(valid.to(torch.int32))  # 0 when no row is valid
    src = torch.where(valid, rows, first_valid)
    slots = slot_mapping[src].clamp(min=0)
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots % block_size
    any_valid = valid.any()
    for new, cache in ((key, k_cache), (value, v_cache)):
        rows_new = torch.where(any_valid, new[src].to(cache.dtype), cache[blocks, offsets])
        cache[blocks, offsets] = rows_new


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
