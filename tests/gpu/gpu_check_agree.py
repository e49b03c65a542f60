"""``backends_agree`` for ``bench_gpu.py decode``: every attention backend that runs here
against ``reference`` on the same weights: a packed prefill of a few requests, then a decode
step fed the *reference's* tokens; the largest absolute logit difference of each. One more row,
``triton+fused``: the Triton backend with the fused layer kernels (RMSNorm, RoPE + KV store,
SiLU-and-mul), the configuration the ShareGPT runs use on CUDA, fed the same tokens; and
``fused_vs_unfused``: its logits against the Triton backend's with the PyTorch layer ops."""

from __future__ import annotations

AGREE_PROMPT_LENS = (5, 17, 33, 40)  # the check's requests
BACKENDS = ("reference", "torch", "triton", "flash-attn")
FUSED_ROW = "triton+fused"  # attention by Triton, layer ops fused
FUSED_ATTENTION = "triton"


def backends_agree(args, device, dtype, model=None) -> dict:
    """{backend: max |logits - reference logits|} over a packed prefill and one decode step
    fed the reference's tokens (issue 12 item 8: one argmax flip must not derail the check);
    None for a backend that cannot run here (the reason under ``why``).

    ``model``: an already built ``--agree-model`` to reuse (its kernels are switched in place);
    else one is built. Every backend row runs the PyTorch layer ops, so only attention differs;
    the ``triton+fused`` row differs from the ``triton`` row only in the layer ops."""
    from cbbench.kernels import available_backends, get_backend, layer_ops

    result: dict = {"max_abs_diff": {}, "why": {}, "model": args.agree_model,
                    "fused_vs_unfused": None}  # fmt: skip
    logits: dict = {}
    reference_tokens = None
    for name in (*BACKENDS, FUSED_ROW):
        fused = name == FUSED_ROW
        attention = FUSED_ATTENTION if fused else name
        if fused and "triton" not in available_backends(device):
            result["max_abs_diff"][name] = None
            result["why"][name] = "the fused Triton kernels cannot run here"
            continue
        try:
            backend = get_backend(attention, device, block_size=args.block_size)
        except (RuntimeError, ValueError) as exc:
            result["max_abs_diff"][name] = None
            result["why"][name] = str(exc).splitlines()[0][:200]
            continue
        if model is None:
            from cbbench.engine.torch.models.loader import load_model

            model, _ = load_model(args.agree_model, dtype, device, backend, seed=0,
                                  max_model_len=args.max_model_len)  # fmt: skip
        model.set_layer_ops(layer_ops(fused))
        model.set_attention_backend(backend)
        logits[name], tokens = _prefill_then_decode(model, args.block_size, device, dtype,
                                                    reference_tokens)  # fmt: skip
        if reference_tokens is None:
            reference_tokens = tokens
        result["max_abs_diff"][name] = _max_abs_diff(logits[name], logits[BACKENDS[0]])
    if FUSED_ROW in logits and FUSED_ATTENTION in logits:
        result["fused_vs_unfused"] = _max_abs_diff(logits[FUSED_ROW], logits[FUSED_ATTENTION])
    if model is not None:
        model.set_layer_ops(layer_ops(False))
    return result


def _max_abs_diff(a, b) -> float:
    return float((a - b).abs().max())


def _prefill_then_decode(model, block, device, dtype, fed_tokens):
    """Logits (float32, CPU) of a packed prefill of AGREE_PROMPT_LENS then one decode step
    fed ``fed_tokens`` (else this run's own argmax); returns (logits, the prefill's argmax)."""
    import torch

    from cbbench.engine.core.request import Request
    from cbbench.engine.core.scheduler_output import SchedulerOutput
    from cbbench.engine.torch.model_runner import ModelRunner
    from cbbench.engine.torch.models.llama import allocate_kv_cache

    config = model.config
    blocks_per_req = -(-(max(AGREE_PROMPT_LENS) + 2) // block)
    kv = allocate_kv_cache(config, blocks_per_req * len(AGREE_PROMPT_LENS) + 1, block, dtype,
                           device)  # fmt: skip
    runner = ModelRunner(model, config, kv, block, device, dtype)
    gen = torch.Generator().manual_seed(0)
    reqs = []
    for i, n in enumerate(AGREE_PROMPT_LENS):
        ids = torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
        req = Request(i, n, 4, prompt_token_ids=ids)
        req.block_table = list(range(1 + i * blocks_per_req, 1 + (i + 1) * blocks_per_req))
        reqs.append(req)
    counts = list(AGREE_PROMPT_LENS)
    with torch.inference_mode():
        prefill = runner.compute_logits(
            runner.prepare(SchedulerOutput(reqs, counts, 0, sum(counts), sum(counts)))
        )
        tokens = prefill.argmax(-1).tolist()
        for req, n, tok in zip(reqs, counts, fed_tokens or tokens, strict=True):
            req.num_computed_tokens = n
            req.output_token_ids.append(tok)
            req.num_output_tokens = 1
        decode = runner.compute_logits(
            runner.prepare(SchedulerOutput(reqs, [1] * len(reqs), len(reqs), 0, len(reqs)))
        )
    return torch.cat([prefill, decode]).float().cpu(), tokens
