"""The elementwise work of a decoder layer, behind one object the model is given at construction.

``LayerOps`` is the PyTorch implementation: the reference, and the CPU default.
``FusedLayerOps`` runs the same maths as three Triton kernels (residual add + RMSNorm, RoPE +
KV-cache store, SiLU-and-mul), so a decode step launches a handful of kernels per layer instead
of dozens. The model chooses one with ``layer_ops(fused)``; nothing global decides.

RoPE happens in two steps because its inputs are per iteration, not per layer:
``prepare_rope`` runs once per forward (the PyTorch path gathers each row's cos/sin there; the
fused kernel reads the tables itself) and every layer's ``rope_and_write_kv`` uses the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# write_kv(key, value, k_cache, v_cache, slot_mapping): the attention backend's KV store.
WriteKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalize in float32 (bf16 loses too much in the mean of squares), scale in x's dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (the Hugging Face / GPT-NeoX layout) of
    ``x [tokens, heads, d]`` by per-row ``cos``/``sin`` ``[tokens, 1, d/2]``, in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)


class LayerOps:
    """PyTorch ops (eager, any device)."""

    name = "torch"
    fused = False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm_torch(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(x + residual), x + residual)``: the normed input and the new residual."""
        residual = x + residual
        return rms_norm_torch(residual, weight, eps), residual

    def prepare_rope(self, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        """Per-forward RoPE inputs from the position ids and the ``[max_len, d/2]`` tables."""
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def rope_and_write_kv(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: Any,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        write_kv: WriteKV,
    ) -> torch.Tensor:
        """Rotate q and k; store k and v at ``slot_mapping`` (negative: skip); return q."""
        cos, sin = rope
        k = rope_torch(k, cos, sin)
        write_kv(k, v, k_cache, v_cache, slot_mapping)
        return rope_torch(q, cos, sin)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FusedLayerOps(LayerOps):
    """Triton kernels: compiled on CUDA, interpreted on the CPU under ``TRITON_INTERPRET=1``.
    Writes KV itself (into the shared paged layout), so it works with every attention backend."""

    name = "fused"
    fused = True

    def rms_norm(self, x, weight, eps):
        from .fused_rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        from .fused_rms_norm import add_rms_norm_triton

        return add_rms_norm_triton(x, residual, weight, eps)

    def prepare_rope(self, positions, cos, sin):
        return positions, cos, sin

    def rope_and_write_kv(self, q, k, v, rope, k_cache, v_cache, slot_mapping, write_kv):
        from .fused_rope import rope_store_kv_triton

        positions, cos, sin = rope
        return rope_store_kv_triton(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)

    def silu_and_mul(self, x):
        from .silu_and_mul import silu_and_mul_triton

        return silu_and_mul_triton(x)


def layer_ops(fused: bool) -> LayerOps:
    """The fused Triton ops, or the PyTorch reference ops."""
    return FusedLayerOps() if fused else LayerOps()
