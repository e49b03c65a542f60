"""The Llama family (Llama 2/3/3.x, Qwen2/2.5, Mistral) in plain PyTorch, over packed rows.

Every layer sees one flat batch of ``T`` rows (all new tokens of an iteration, prefill chunks
and decode rows alike); there is no batch dimension and no padding. Only attention needs to know
which rows belong to which request, and it learns that from the explicit ``AttentionMetadata``
passed down with the rows; the KV history lives in the paged cache.

Parameter names follow Hugging Face's, except that q/k/v and gate/up are fused into one matmul
each (``qkv_proj``, ``gate_up_proj``): fewer, larger GEMMs, which matters for small decode
batches. The loader splits the Hugging Face tensors into the fused ones.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cbbench.kernels import AttentionMetadata
from cbbench.kernels.layer_ops import LayerOps, layer_ops

from ...model_config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache) of one layer


# ---------------------------------------------------------------------------------------------
# Rotary position embedding
# ---------------------------------------------------------------------------------------------


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], float32, with Llama-3.x "llama3" scaling if set.

    llama3 scaling leaves high frequencies (short wavelengths) alone, divides low frequencies by
    ``factor``, and interpolates smoothly in between.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])

    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to max_model_len, indexed per row by position."""

    cos: torch.Tensor  # registered buffers
    sin: torch.Tensor

    def __init__(self, config: ModelConfig, device: torch.device | str) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(config)
        positions = torch.arange(config.max_model_len, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_model_len, head_dim / 2]
        # Not persistent: derived from the config, so never part of a checkpoint.
        self.register_buffer("cos", freqs.cos().to(device), persistent=False)
        self.register_buffer("sin", freqs.sin().to(device), persistent=False)

    def forward(self, positions: torch.Tensor, ops: LayerOps):
        """This iteration's RoPE inputs, prepared once and shared by every layer."""
        return ops.prepare_rope(positions, self.cos, self.sin)


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: LayerOps, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.eps = eps
        self.ops = ops
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with a residual, ``(norm(x + residual), x + residual)``."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, attn_backend, ops: LayerOps, dtype: torch.dtype, device
    ) -> None:
        super().__init__()
        self.ops = ops
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.scale = self.head_dim**-0.5
        self.attn_backend = attn_backend
        self.qkv_proj = nn.Linear(
            config.hidden_size,
            self.q_size + 2 * self.kv_size,
            bias=config.qkv_bias,
            dtype=dtype,
            device=device,
        )
        self.o_proj = nn.Linear(
            self.q_size, config.hidden_size, bias=False, dtype=dtype, device=device
        )

    def project_qkv(
        self, x: torch.Tensor, rope, kv_cache: KVCache, slot_mapping: torch.Tensor
    ) -> torch.Tensor:
        """qkv projection, RoPE and the KV store: the query rows ``[T, heads, head_dim]``,
        with this iteration's K/V written into the cache at ``slot_mapping``."""
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        # The backend reads keys only from the cache, so the new K/V must land there first.
        return self.ops.rope_and_write_kv(
            q, k, v, rope, k_cache, v_cache, slot_mapping, self.attn_backend.write_kv
        )

    def attend(self, q: torch.Tensor, kv_cache: KVCache, metadata: AttentionMetadata):
        """The attention backend over the paged cache: ``[T, heads, head_dim]``."""
        k_cache, v_cache = kv_cache
        return self.attn_backend.forward(q, k_cache, v_cache, metadata, self.scale)

    def project_out(self, attn_out: torch.Tensor) -> torch.Tensor:
        """o_proj of attention's ``[T, heads, head_dim]``: ``[T, hidden]``."""
        return self.o_proj(attn_out.reshape(attn_out.shape[0], self.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up in one matmul."""

    def __init__(self, config: ModelConfig, ops: LayerOps, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.ops = ops
        self.gate_up_proj = nn.Linear(
            config.hidden_size,
            2 * config.intermediate_size,
            bias=False,
            dtype=dtype,
            device=device,
        )
        self.down_proj = nn.Linear(
            config.intermediate_size, config.hidden_size, bias=False, dtype=dtype, device=device
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, attn_backend, ops: LayerOps, dtype: torch.dtype, device
    ) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, ops, dtype, device)
        self.self_attn = LlamaAttention(config, attn_backend, ops, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, ops, dtype, device)
        self.mlp = LlamaMLP(config, ops, dtype, device)

    # The layer in two halves around attention: the model's forward calls them with attention
    # between, and so does the piecewise runner (engine/torch/piecewise.py), which captures each half
    # in a CUDA graph and runs attention eagerly: one implementation of the layer for both.

    def pre_attention(
        self, x, residual, rope, kv_cache: KVCache, slot_mapping: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, residual)``: the input norm (which first adds ``x`` to the residual stream;
        ``residual=None`` in the first layer, where the embedding is the stream), then qkv,
        RoPE and the KV store. The new K/V are in the cache when this returns."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        return self.self_attn.project_qkv(x, rope, kv_cache, slot_mapping), residual

    def post_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)`` from attention's ``[T, heads, head_dim]``: o_proj, the
        post-attention norm (adding to the residual), the MLP. The caller's next norm adds the
        two (in one kernel)."""
        x, residual = self.post_attention_layernorm(self.self_attn.project_out(attn_out), residual)
        return self.mlp(x), residual

    def forward(
        self, x, residual, rope, kv_cache: KVCache, metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, residual = self.pre_attention(x, residual, rope, kv_cache, metadata.slot_mapping)
        return self.post_attention(self.self_attn.attend(q, kv_cache, metadata), residual)


class LlamaModel(nn.Module):
    def __init__(
        self, config: ModelConfig, attn_backend, ops: LayerOps, dtype: torch.dtype, device
    ) -> None:
        super().__init__()
        self.ops = ops
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.rotary = RotaryEmbedding(config, device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, attn_backend, ops, dtype, device)
            for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops, dtype, device)

    def forward(self, input_ids, positions, kv_caches: list[KVCache], metadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary(positions, self.ops)  # prepared once, shared by every layer
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, kv_cache, metadata)
        return self.final_norm(x, residual)

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The last layer's output added to the residual stream, normed."""
        if residual is None:  # no layers
            return self.norm(x)
        return self.norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        attn_backend,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        fused: bool = False,
    ) -> None:
        """``fused``: the Triton layer kernels (CUDA, or the CPU under TRITON_INTERPRET=1)
        instead of the PyTorch ops; the attention backend is chosen separately."""
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.ops = layer_ops(fused)
        self.model = LlamaModel(config, attn_backend, self.ops, dtype, device)
        self.lm_head = nn.Linear(
            config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
        )
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # Switching kernels in place (same weights): a benchmark times several configurations of
    # one model without rebuilding it. A ModelRunner built on the model before a switch must be
    # built again: its CUDA graphs replay the kernels they captured.

    def set_layer_ops(self, ops: LayerOps) -> None:
        """Use ``ops`` (``layer_ops(fused)``) in every module that takes layer ops."""
        for module in self.modules():
            if hasattr(module, "ops"):
                setattr(module, "ops", ops)  # noqa: B010 (nn.Module types its attributes as tensors or modules)

    def set_attention_backend(self, attn_backend) -> None:
        """Use ``attn_backend`` (same paged KV layout, any backend) in every layer."""
        for module in self.modules():
            if hasattr(module, "attn_backend"):
                module.attn_backend = attn_backend

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] of the packed rows; writes their K/V to the cache."""
        return self.model(input_ids, positions, kv_caches, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, vocab] for the rows that sample (the runner selects them)."""
        return self.lm_head(hidden).float()


def allocate_kv_cache(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[KVCache]:
    """One (k_cache, v_cache) per layer, each [num_blocks, block_size, num_kv_heads, head_dim].

    Zero-filled rather than empty: padding rows read block 0, and finite garbage is harmless
    where NaN bit patterns would not be.
    """
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(config.num_layers)
    ]
