"""The model's forward cut at attention, for piecewise CUDA graphs of mixed iterations.

A mixed prefill + decode iteration cannot replay one whole-forward graph: attention's launch
shape depends on the request count and lengths, not only on the token count. Everything else
(embedding, norms, projections, RoPE + KV store, MLP) depends only on the token count. So, as
vLLM does, the forward is split at each layer's attention into ``num_layers + 1`` pieces that
are captured per padded token count, and attention runs eagerly between them on the real
(unpadded) rows:

    piece 0:      embed -> layer 0 input norm -> qkv -> RoPE + KV store  -> q
    piece i:      o_proj(attn of layer i-1) -> post-attention norm -> MLP
                  -> layer i input norm -> qkv -> RoPE + KV store       -> q
    piece L:      o_proj(attn of layer L-1) -> post-attention norm -> MLP -> final norm

Pieces talk through static buffers (q, attention output, residual stream, final hidden), the
same for every layer and size, so the graphs hold no per-layer activations. Padding rows (token
0 at position 0, KV slot -1) run through the pieces and produce finite garbage nobody reads;
their attention output is whatever the buffer held (finite). RoPE's per-step inputs are
prepared again in each piece from the static positions (a gather on the unfused path; nothing
on the fused one), rather than kept alive across graphs.

This mirrors ``LlamaModel``/``LlamaDecoderLayer``/``LlamaAttention.forward`` step for step;
``tests/test_model_runner.py`` checks that the pieces run eagerly equal ``model.forward``.
"""

from __future__ import annotations

import torch

from cbbench.kernels import AttentionMetadata

from .models.llama import KVCache, LlamaForCausalLM


class ForwardPieces:
    def __init__(self, model: LlamaForCausalLM, max_tokens: int, dtype, device) -> None:
        self.model = model.model  # LlamaModel
        self.layers = list(self.model.layers)
        cfg = model.config
        attn = self.layers[0].self_attn
        self.num_pieces = len(self.layers) + 1
        self.q_shape = (attn.num_heads, attn.head_dim)
        self.q_buf = torch.zeros(max_tokens, *self.q_shape, dtype=dtype, device=device)
        self.attn_buf = torch.zeros(max_tokens, *self.q_shape, dtype=dtype, device=device)
        self.residual_buf = torch.zeros(max_tokens, cfg.hidden_size, dtype=dtype, device=device)
        self.hidden_buf = torch.zeros(max_tokens, cfg.hidden_size, dtype=dtype, device=device)

    # ---- the pieces (captured per padded token count) --------------------------------------------

    def run_piece(
        self,
        index: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_caches: list[KVCache],
    ) -> None:
        """Piece ``index`` over ``n = len(input_ids)`` rows: static buffers in, static out."""
        n = input_ids.shape[0]
        if index == 0:
            x = self.model.embed_tokens(input_ids)
            x, residual = self.layers[0].input_layernorm(x), x
        else:
            prev = self.layers[index - 1]
            x = prev.self_attn.o_proj(self.attn_buf[:n].reshape(n, -1))
            x, residual = prev.post_attention_layernorm(x, self.residual_buf[:n])
            x = prev.mlp(x)
            if index == len(self.layers):
                self.hidden_buf[:n] = self.model.norm(x, residual)[0]
                return
            x, residual = self.layers[index].input_layernorm(x, residual)
        self.residual_buf[:n] = residual
        rope = self.model.rotary(positions, self.model.ops)
        self.q_buf[:n] = self._qkv_rope_store(self.layers[index].self_attn, x, rope,
                                              kv_caches[index], slot_mapping)  # fmt: skip

    @staticmethod
    def _qkv_rope_store(attn, x, rope, kv_cache: KVCache, slot_mapping) -> torch.Tensor:
        """LlamaAttention.forward up to the attention call: q, with K/V stored in the cache."""
        n = x.shape[0]
        q, k, v = attn.qkv_proj(x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = q.view(n, attn.num_heads, attn.head_dim)
        k = k.view(n, attn.num_kv_heads, attn.head_dim)
        v = v.view(n, attn.num_kv_heads, attn.head_dim)
        k_cache, v_cache = kv_cache
        return attn.ops.rope_and_write_kv(
            q, k, v, rope, k_cache, v_cache, slot_mapping, attn.attn_backend.write_kv
        )

    # ---- between the pieces (eager) ----------------------------------------------------------

    def attention(
        self, layer: int, kv_caches: list[KVCache], metadata: AttentionMetadata
    ) -> None:
        """Layer ``layer``'s attention on the real rows of q_buf, into attn_buf."""
        n = metadata.num_tokens
        attn = self.layers[layer].self_attn
        k_cache, v_cache = kv_caches[layer]
        out = attn.attn_backend.forward(self.q_buf[:n], k_cache, v_cache, metadata, attn.scale)
        self.attn_buf[:n] = out

    def forward(self, run_piece, kv_caches: list[KVCache], metadata: AttentionMetadata):
        """The whole forward: ``run_piece(i)`` runs (or replays) piece i; attention between.
        Returns the final hidden states of the real rows."""
        for i in range(self.num_pieces):
            run_piece(i)
            if i < len(self.layers):
                self.attention(i, kv_caches, metadata)
        return self.hidden_buf[: metadata.num_tokens]
