"""Paged attention backends behind one metadata contract (see :mod:`.metadata`).

Backends are imported lazily, so importing this package needs neither triton nor flash-attn,
and Triton's ``TRITON_INTERPRET`` choice is made only when the triton backend is first used.
"""

from __future__ import annotations

import torch

from .availability import fused_layer_ops_unfaithful_reason, triton_unavailable_reason
from .backend import AttentionBackend
from .compilation import CompilationCounter, compilation_counter
from .layer_ops import FusedLayerOps, LayerOps, layer_ops
from .metadata import AttentionMetadata, build_metadata

__all__ = [
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "CompilationCounter",
    "FusedLayerOps",
    "LayerOps",
    "available_backends",
    "build_metadata",
    "compilation_counter",
    "fused_layer_ops_unfaithful_reason",
    "get_backend",
    "layer_ops",
    "triton_unavailable_reason",
]

BACKEND_NAMES = ("auto", "reference", "torch", "triton", "flash-attn")


def _flash_reason(device: torch.device, block_size: int | None) -> str | None:
    from .flash_attn_backend import check_block_size, unavailable_reason

    reason = unavailable_reason(device)
    if reason is None and block_size is not None:
        try:
            check_block_size(block_size)
        except ValueError as exc:
            return str(exc)
    return reason


def available_backends(device: torch.device | str, block_size: int | None = None) -> list[str]:
    """The concrete backends (never ``auto``) that can run on ``device``, slowest first."""
    device = torch.device(device)
    names = ["reference", "torch"]
    if triton_unavailable_reason(device) is None:
        names.append("triton")
    if _flash_reason(device, block_size) is None:
        names.append("flash-attn")
    return names


def resolve_backend_name(
    name: str, device: torch.device | str, block_size: int | None = None
) -> str:
    """Map ``auto`` to a concrete name: flash-attn (when it can page at ``block_size``), else
    triton on CUDA when a Triton kernel really launches there, else torch. None of them syncs
    with the host per layer on CUDA (their KV writes are index-based or a Triton kernel)."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; valid: {', '.join(BACKEND_NAMES)}")
    if name != "auto":
        return name
    device = torch.device(device)
    # flash-attn's paged mode depends on the block size: without it, auto cannot vouch for it.
    if block_size is not None and _flash_reason(device, block_size) is None:
        return "flash-attn"
    if device.type == "cuda" and triton_unavailable_reason(device) is None:
        return "triton"
    return "torch"


def get_backend(
    name: str, device: torch.device | str, block_size: int | None = None
) -> AttentionBackend:
    """Backend ``name`` (one of ``BACKEND_NAMES``) for ``device``.

    Raises ``ValueError`` for an unknown name (or a block size flash-attn cannot page) and
    ``RuntimeError`` with a one-line reason when the backend cannot run on ``device``.
    ``block_size`` is optional: ``auto`` needs it to consider flash-attn.
    """
    device = torch.device(device)
    name = resolve_backend_name(name, device, block_size)
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend()
    if name == "torch":
        from .torch_native import TorchBackend

        return TorchBackend()
    if name == "triton":
        reason = triton_unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(reason)
        from .triton_attention import TritonBackend

        return TritonBackend()
    from .flash_attn_backend import check_block_size, unavailable_reason

    reason = unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(reason)
    if block_size is not None:
        check_block_size(block_size)
    from .flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()
