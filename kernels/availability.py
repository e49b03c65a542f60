"""Whether Triton kernels can run on a device (the attention backend and the fused layer ops
both ask; below the package and the backends so that each can import it)."""

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
