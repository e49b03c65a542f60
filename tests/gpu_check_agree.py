"""``backends_agree`` for ``bench_gpu.py decode``: every attention backend that runs here
against ``reference`` on the same weights: a packed prefill of a few requests, then a decode
step fed the *reference's* tokens; the largest absolute logit difference of each."""

from __future__ import annotations

AGREE_PROMPT_LENS = (5, 17, 33, 40)  # the check's requests


def backends_agree(args, device, dtype, model=None) -> dict:
    """{backend: max |logits - reference logits|} over a packed prefill and one decode step
    fed the reference's tokens (issue 12 item 8: one argmax flip must not derail the check);
    None for a backend that cannot run here (the reason under ``why``).

    ``model``: an already built ``--agree-model`` to reuse (its kernels are switched in place);
    else one is built. Every backend runs the PyTorch layer ops, so only attention differs."""
    import torch

    from cbbench.engine.model_runner import ModelRunner
    from cbbench.engine.models.llama import allocate_kv_cache
    from cbbench.engine.models.loader import load_model
    from cbbench.engine.request import Request
    from cbbench.engine.scheduler_output import SchedulerOutput
    from cbbench.kernels import get_backend, layer_ops

    block = args.block_size
    result: dict = {"max_abs_diff": {}, "why": {}, "model": args.agree_model}
    reference_logits = reference_tokens = None
    config = None if model is None else model.config
    for name in ("reference", "torch", "triton", "flash-attn"):
        try:
            backend = get_backend(name, device, block_size=block)
        except (RuntimeError, ValueError) as exc:
            result["max_abs_diff"][name] = None
            result["why"][name] = str(exc).splitlines()[0][:200]
            continue
        if model is None:
            model, config = load_model(args.agree_model, dtype, device, backend, seed=0,
                                       max_model_len=args.max_model_len)  # fmt: skip
        model.set_layer_ops(layer_ops(False))
        model.set_attention_backend(backend)
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
            tokens = prefill.argmax(-1).tolist() if reference_tokens is None else reference_tokens
            for req, n, tok in zip(reqs, counts, tokens, strict=True):
                req.num_computed_tokens = n
                req.output_token_ids.append(tok)
                req.num_output_tokens = 1
            decode = runner.compute_logits(
                runner.prepare(SchedulerOutput(reqs, [1] * len(reqs), len(reqs), 0, len(reqs)))
            )
        logits = torch.cat([prefill, decode]).float().cpu()
        if reference_logits is None:
            reference_logits, reference_tokens = logits, tokens
        result["max_abs_diff"][name] = float((logits - reference_logits).abs().max())
        del runner, kv
    return result
