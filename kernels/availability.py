"""Whether Triton kernels can run on a device (the attention backend and the fused layer ops
both ask; below the package and the backends so that each can import it), and whether the fused
layer ops compute there what the PyTorch ops they replace compute."""

from __future__ import annotations

import importlib.util

import torch


def triton_unavailable_reason(device: torch.device | str) -> str | None:
    """Why Triton kernels (attention or the fused layer ops) cannot run on ``device``, or
    ``None`` when they can: installed, importable, the right device, and a probe kernel really
    launched there (once per device per process; see :mod:`.triton_probe`)."""
    device = torch.device(device)
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    try:
        from .triton_common import check_device
        from .triton_probe import launch_failure
    except Exception as exc:  # a broken triton install
        return f"triton failed to import: {exc}"
    try:
        check_device(device)
    except RuntimeError as exc:
        return str(exc)
    return launch_failure(device)


def fused_layer_ops_unfaithful_reason(dtype: torch.dtype) -> str | None:
    """Why the fused layer kernels would not round as ``LayerOps`` does in ``dtype`` here, or
    ``None``. Triton's interpreter casts float32 to bfloat16 by dropping the low 16 bits (1.0078
    becomes 1.0 where PyTorch rounds to 1.0078); its float16 casts round to nearest, as compiled
    Triton's casts do on a GPU. The fused kernels round in every step the reference does (the
    residual sum, the normed value, RoPE's output), so in bf16 interpreted each step may land one
    bf16 step off and a greedy run's tokens drift from the unfused model's (the tiny preset,
    6 requests of 24 tokens: one request from its 10th token)."""
    from .triton_common import INTERPRETED

    if INTERPRETED and dtype == torch.bfloat16:
        return (
            "Triton's interpreter (TRITON_INTERPRET=1) casts float32 to bfloat16 by truncation "
            "where PyTorch rounds to nearest, so the fused kernels' tokens drift from the "
            "unfused model's"
        )
    return None
