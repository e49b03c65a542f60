"""``flash-attn``: FlashAttention-2's varlen kernel reading the paged cache via ``block_table``.

flash-attn's causal mask is aligned bottom-right, exactly the metadata's contract. Its paged
mode needs CUDA, fp16/bf16 and a block size that is a multiple of 256.
"""

from __future__ import annotations

import importlib.util

import torch

from .availability import triton_unavailable_reason
from .backend import AttentionBackend, check_shapes, write_kv_torch
from .metadata import AttentionMetadata, cu_seqlens_k_of

PAGED_BLOCK_MULTIPLE = 256  # flash-attn's paged KV requires block_size % 256 == 0
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def is_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def unavailable_reason(device: torch.device) -> str | None:
    """Why flash-attn cannot run on ``device``, or ``None`` when it can."""
    if device.type != "cuda":
        return f"flash-attn needs a CUDA device, got {device.type!r}"
    if not torch.cuda.is_available():
        return "flash-attn needs CUDA, which is not available here"
    if not is_installed():
        return "flash-attn is not installed (pip install flash-attn)"
    try:
        import flash_attn  # noqa: F401
    except Exception as exc:  # a broken build raises ImportError/OSError/RuntimeError
        return f"flash-attn is installed but failed to import: {exc}"
    return None


def check_block_size(block_size: int) -> None:
    if block_size % PAGED_BLOCK_MULTIPLE != 0:
        raise ValueError(
            f"flash-attn needs a block size that is a multiple of {PAGED_BLOCK_MULTIPLE}, "
            f"got {block_size}"
        )


class FlashAttnBackend(AttentionBackend):
    name = "flash-attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        """The Triton store kernel where a Triton kernel can launch (one launch per layer),
        else the index-based write; neither syncs with the host (CUDA-graph safe)."""
        if key.device.type == "cuda" and triton_unavailable_reason(key.device) is None:
            from .triton_attention import TritonBackend

            TritonBackend().write_kv(key, value, k_cache, v_cache, slot_mapping)
        else:
            write_kv_torch(key, value, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        check_shapes(query, k_cache, v_cache, metadata)
        check_block_size(metadata.block_size)
        if query.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"flash-attn supports fp16 and bf16 only, got {query.dtype}")
        if metadata.num_tokens == 0:
            return torch.empty_like(query)
        return self._varlen(
            query,
            k_cache,
            v_cache,
            cu_seqlens_q=metadata.cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k_of(metadata),
            max_seqlen_q=metadata.max_seqlen_q,
            max_seqlen_k=metadata.max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            block_table=metadata.block_tables,
        )
