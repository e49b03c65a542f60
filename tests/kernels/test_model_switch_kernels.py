"""Switching a built model's layer kernels and attention backend in place
(``set_layer_ops``, ``set_attention_backend``) computes what a model built that way does:
a benchmark can time several configurations of one model without rebuilding it."""

from __future__ import annotations

import torch

from cbbench.engine.torch.models.llama import allocate_kv_cache
from cbbench.engine.torch.models.loader import load_model
from cbbench.kernels import available_backends, get_backend, layer_ops

BLOCK = 16
PROMPTS = (5, 17, 33)


def _prefill_then_decode(model, config) -> torch.Tensor:
    """Logits of a packed prefill of three prompts and one decode step after it."""
    from cbbench.engine.core.request import Request
    from cbbench.engine.core.scheduler_output import SchedulerOutput
    from cbbench.engine.torch.model_runner import ModelRunner

    per_req = -(-(max(PROMPTS) + 2) // BLOCK)
    kv = allocate_kv_cache(config, per_req * len(PROMPTS) + 1, BLOCK, torch.float32, "cpu")
    runner = ModelRunner(model, config, kv, BLOCK, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(0)
    reqs = []
    for i, n in enumerate(PROMPTS):
        ids = torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
        req = Request(i, n, 4, prompt_token_ids=ids)
        req.block_table = list(range(1 + i * per_req, 1 + (i + 1) * per_req))
        reqs.append(req)
    with torch.inference_mode():
        counts = list(PROMPTS)
        prefill = runner.compute_logits(
            runner.prepare(SchedulerOutput(reqs, counts, 0, sum(counts), sum(counts)))
        )
        for req, n in zip(reqs, PROMPTS, strict=True):
            req.num_computed_tokens = n
            req.output_token_ids.append(7)
            req.num_output_tokens = 1
        decode = runner.compute_logits(
            runner.prepare(SchedulerOutput(reqs, [1] * len(reqs), len(reqs), 0, len(reqs)))
        )
    return torch.cat([prefill, decode])


def _build(backend: str, fused: bool):
    return load_model("tiny", torch.float32, "cpu", get_backend(backend, "cpu", block_size=BLOCK),
                      seed=0, fused=fused)  # fmt: skip


def test_switching_the_attention_backend_equals_building_with_it():
    model, config = _build("reference", fused=False)
    before = _prefill_then_decode(model, config)
    torch_backend = get_backend("torch", "cpu", block_size=BLOCK)
    model.set_attention_backend(torch_backend)
    assert all(
        layer.self_attn.attn_backend is torch_backend for layer in model.model.layers
    ) and model.attn_backend is torch_backend
    switched = _prefill_then_decode(model, config)
    built, _ = _build("torch", fused=False)
    torch.testing.assert_close(switched, _prefill_then_decode(built, config), atol=0, rtol=0)
    torch.testing.assert_close(switched, before, atol=1e-4, rtol=0)  # torch vs reference


def test_switching_layer_ops_reaches_every_module_and_back():
    model, config = _build("torch", fused=False)
    unfused = _prefill_then_decode(model, config)
    fused_ops = layer_ops(True)
    model.set_layer_ops(fused_ops)
    users = [m for m in model.modules() if hasattr(m, "ops")]
    # The model, its stack, every norm (2 per layer + the final one), attention and MLP.
    assert len(users) == 2 + 1 + 4 * config.num_layers
    assert all(m.ops is fused_ops for m in users)
    if "triton" in available_backends("cpu"):  # TRITON_INTERPRET=1 (the test conftest's)
        built, _ = _build("torch", fused=True)
        switched = _prefill_then_decode(model, config)
        torch.testing.assert_close(switched, _prefill_then_decode(built, config), atol=0, rtol=0)
        torch.testing.assert_close(switched, unfused, atol=1e-4, rtol=0)
    model.set_layer_ops(layer_ops(False))
    torch.testing.assert_close(_prefill_then_decode(model, config), unfused, atol=0, rtol=0)
