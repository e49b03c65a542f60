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
import torch.nn.functional as F
from torch import nn

from cbbench.kernels import AttentionMetadata

from ..model_config import ModelConfig

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

    def __init__(self, config: ModelConfig, device: torch.device | str) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(config)
        positions = torch.arange(config.max_model_len, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_model_len, head_dim / 2]
        # Not persistent: derived from the config, so never part of a checkpoint.
        self.register_buffer("cos", freqs.cos().to(device), persistent=False)
        self.register_buffer("sin", freqs.sin().to(device), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [T, 1, head_dim / 2]: broadcasts over heads.
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (the Hugging Face / GPT-NeoX layout), in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 (bf16 loses too much in the mean of squares), scale in x's dtype.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend, dtype: torch.dtype, device) -> None:
        super().__init__()
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

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(num_tokens, self.num_heads, self.head_dim), *rope)
        k = apply_rotary(k.view(num_tokens, self.num_kv_heads, self.head_dim), *rope)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        # The backend reads keys only from the cache, so the new K/V must land there first.
        self.attn_backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        out = self.attn_backend.forward(q, k_cache, v_cache, metadata, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up in one matmul."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device) -> None:
        super().__init__()
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
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(config, attn_backend, dtype, device)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, dtype, device
        )
        self.mlp = LlamaMLP(config, dtype, device)

    def forward(self, x, rope, kv_cache: KVCache, metadata: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.rotary = RotaryEmbedding(config, device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, attn_backend, dtype, device) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)

    def forward(self, input_ids, positions, kv_caches: list[KVCache], metadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary(positions)  # looked up once, shared by every layer
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, rope, kv_cache, metadata)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        attn_backend,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.model = LlamaModel(config, attn_backend, dtype, device)
        self.lm_head = nn.Linear(
            config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
        )
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

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
