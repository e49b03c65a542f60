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

The layer's maths is the model's own: each piece calls ``LlamaDecoderLayer.post_attention``
and ``pre_attention`` (the halves of the layer the model's forward also calls, with attention
between) and ``LlamaModel.final_norm``; only the buffers and the cut are this module's.
``tests/engine/test_model_runner.py`` checks that the pieces run eagerly equal ``model.forward``.
"""

from __future__ import annotations

from typing import cast

import torch

from cbbench.kernels import AttentionMetadata

from .models.llama import KVCache, LlamaDecoderLayer, LlamaForCausalLM


class ForwardPieces:
    def __init__(self, model: LlamaForCausalLM, max_tokens: int, dtype, device) -> None:
        self.model = model.model  # LlamaModel
        # nn.ModuleList types its items as Module; LlamaModel fills it with decoder layers.
        self.layers = cast(list[LlamaDecoderLayer], list(self.model.layers))
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
            x, residual = self.model.embed_tokens(input_ids), None
        else:
            x, residual = self.layers[index - 1].post_attention(
                self.attn_buf[:n], self.residual_buf[:n]
            )
            if index == len(self.layers):
                self.hidden_buf[:n] = self.model.final_norm(x, residual)
                return
        rope = self.model.rotary(positions, self.model.ops)
        q, residual = self.layers[index].pre_attention(
            x, residual, rope, kv_caches[index], slot_mapping
        )
        self.residual_buf[:n] = residual
        self.q_buf[:n] = q

    # ---- between the pieces (eager) ----------------------------------------------------------

    def attention(
        self, layer: int, kv_caches: list[KVCache], metadata: AttentionMetadata
    ) -> None:
        """Layer ``layer``'s attention on the real rows of q_buf, into attn_buf."""
        n = metadata.num_tokens
        self.attn_buf[:n] = self.layers[layer].self_attn.attend(
            self.q_buf[:n], kv_caches[layer], metadata
        )

    def forward(self, run_piece, kv_caches: list[KVCache], metadata: AttentionMetadata):
        """The whole forward: ``run_piece(i)`` runs (or replays) piece i; attention between.
        Returns the final hidden states of the real rows."""
        for i in range(self.num_pieces):
            run_piece(i)
            if i < len(self.layers):
                self.attention(i, kv_caches, metadata)
        return self.hidden_buf[: metadata.num_tokens]
