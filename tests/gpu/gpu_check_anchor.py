"""``bench_gpu.py anchor``: Hugging Face ``generate`` on the same GPU, beside cbbench's figures,
so the check's figures are ratios and not lone numbers (issue 29 item 7, issue 39 item 4).

The same random-weight model as cbbench's (built from the same preset: a
``transformers.LlamaConfig`` with its sizes), in the same dtype. Two parts, in this order:

- ``decode`` (first, so it always gets its time): ms per decode step at batch 1 and 16 with a
  static KV cache and the decode step compiled (gpt-fast's recipe, as transformers implements
  it: with a static cache on CUDA, ``generate`` compiles the one-token decode forward,
  ``CompileConfig(fullgraph=True, mode="reduce-overhead")``, and runs the prefill eagerly; we
  do not wrap ``forward`` ourselves, which compiled the prefill too and compiled twice), prompt
  ``--context`` tokens as cbbench's decode bench: each batch size is generated twice with
  ``--short`` and ``--long`` new tokens (``min_new_tokens`` = ``max_new_tokens``: no early
  stop), and the step time is the difference over the extra tokens, so prefill and compile
  drop out. ``--decode-budget-s`` bounds the part (compilation included): a batch size not
  started in time is null with the reason, and each finished one is written at once;
- ``throughput``: the same ShareGPT requests as ``cbbench run --workload sharegpt
  --num-requests N`` (the same draw: ``sample_requests`` with the run's seed), in static
  batches of ``--batch-size`` in order: each batch left-padded to its longest prompt and
  generated to its longest output; a request's useful tokens are its own output length.
  Eager (``disable_compile``: with a static cache transformers would otherwise compile the
  decode forward for every new batch shape, which is where the H100 run's 200 s went). Bounded
  by ``--token-budget`` generated tokens (padding included: that is the work) and by the
  step's time: it stops starting batches at either and reports the output tokens per second
  of the batches it finished, with how many that was (``partial`` when not all).

Each part is written to ``anchor.json`` as soon as it is done (a timeout keeps what finished);
a part that cannot run (no transformers, out of memory, out of time) is null with its reason.
Compilation runs on CUDA only (``--compile auto``); the CPU smoke test runs the same code
eagerly on the tiny preset. UNTESTED on a GPU so far.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

DECODE_BATCHES = (1, 16)


def _write(out: Path, result: dict) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(out)


REPO = Path(__file__).resolve().parents[2]


@contextmanager
def _hf_kernels_not_ours():
    """transformers imports the ``kernels`` distribution (HF's hub kernels) when it is
    installed; with the repository's root on sys.path (``python -m pytest`` or ``python -c``
    from it, or a test that put it there) ``import kernels`` finds this project's ``kernels/``
    folder instead, and importing LlamaForCausalLM fails (``cannot import name
    'CUDAProperties' from 'kernels'``: seen in the full test_gpu_check.py run). Hide the root
    while transformers imports."""
    def ours(p: str) -> bool:
        try:
            return Path(p or ".").resolve() == REPO
        except OSError:
            return False

    saved_path = sys.path[:]
    shadow = sys.modules.get("kernels")
    if shadow is not None and Path(getattr(shadow, "__file__", "") or "").parent == REPO / "kernels":
        del sys.modules["kernels"]
    else:
        shadow = None
    sys.path[:] = [p for p in sys.path if not ours(p)]
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if shadow is not None and "kernels" not in sys.modules:
            sys.modules["kernels"] = shadow


def hf_model(preset: str, dtype, device, seed: int = 0):
    """A random-weight ``LlamaForCausalLM`` with the preset's sizes."""
    import torch

    with _hf_kernels_not_ours():
        from transformers import LlamaConfig, LlamaForCausalLM

    from cbbench.engine.model_config import MODEL_PRESETS

    c = MODEL_PRESETS[preset]
    cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_model_len, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.qkv_bias, torch_dtype=dtype,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    model.eval()
    # Random weights sample EOS as often as any token: generation never stops early here.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model, c


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate(model, ids, new_tokens: int, device, **kw) -> float:
    import torch

    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, **kw)  # fmt: skip
    _sync(device)
    return time.perf_counter() - t0


def _compile_settings(model, compiled: bool, max_cache_len: int | None = None) -> None:
    """Compile the decode step the way transformers does for a static cache, or never.
    ``max_cache_len``: one static-cache length for every call (transformers >= 5.2x reads it;
    older ones size the cache to the longest call so far), so one compiled graph serves all."""
    gc = model.generation_config
    gc.cache_implementation = "static"
    gc.max_cache_len = max_cache_len
    if compiled:
        from transformers import CompileConfig

        gc.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
        gc.compile_config._compile_all_devices = True  # --compile on: a CPU too
        gc.disable_compile = False
    else:
        gc.disable_compile = True


def decode_anchor(model, cfg, args, device, deadline: float = float("inf"), on_batch=None) -> dict:
    """ms per decode step, static cache (+ the compiled decode step on CUDA), by batch size;
    a batch size not started by ``deadline`` is null with the reason. ``on_batch(out)`` after
    each batch size (the caller writes the file)."""
    import torch

    compiled = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    _compile_settings(model, compiled, args.context + args.long)
    g = torch.Generator().manual_seed(1)
    out = {"compiled": compiled, "context": args.context, "short": args.short, "long": args.long,
           "ms_per_step": {}, "seconds": {}, "why_not": {}}  # fmt: skip
    for bs in DECODE_BATCHES:
        t0 = time.perf_counter()
        if t0 > deadline:
            out["ms_per_step"][str(bs)] = None
            out["why_not"][str(bs)] = "out of time (the decode part's budget) before this batch"
            continue
        try:
            ids = torch.randint(0, cfg.vocab_size, (bs, args.context), generator=g).to(device)
            # Warm-up at the longer length first: the static cache is sized to the largest
            # length asked so far (and to max_cache_len where transformers has it), so both
            # timed lengths then run on one cache shape and one compiled graph.
            _generate(model, ids, args.long, device)
            # The faster of two runs of each length: the difference is the extra steps' time.
            t_short = min(_generate(model, ids, args.short, device) for _ in range(2))
            t_long = min(_generate(model, ids, args.long, device) for _ in range(2))
            ms = (t_long - t_short) / (args.long - args.short) * 1000
            if ms <= 0:
                raise RuntimeError(f"timing noise: {args.long} new tokens took no longer than "
                                   f"{args.short} ({t_long:.3f} s vs {t_short:.3f} s)")  # fmt: skip
            out["ms_per_step"][str(bs)] = ms
        except Exception as exc:  # noqa: BLE001 - a missing piece is a reason, not a crash
            out["ms_per_step"][str(bs)] = None
            out["why_not"][str(bs)] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        out["seconds"][str(bs)] = round(time.perf_counter() - t0, 3)
        print(f"hf decode bs {bs}: {out['ms_per_step'][str(bs)]} ms/step "
              f"({out['seconds'][str(bs)]} s incl. compile)", flush=True)  # fmt: skip
        if on_batch is not None:
            on_batch(out)
    return out


def sharegpt_requests(num_requests: int, seed: int) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of the requests ``cbbench run --workload sharegpt
    --num-requests N --seed S`` draws, in its order."""
    from cbbench.load.workload import load_workload, sample_requests

    drawn, _ = sample_requests(load_workload("sharegpt"), num_requests, seed)
    return [(r.prompt_len, r.output_len) for r in drawn]


def throughput_anchor(model, cfg, args, device, deadline: float) -> dict:
    """Static batches of the same ShareGPT requests, eager; output tokens / s over the batches
    finished before ``args.token_budget`` generated tokens or ``deadline``."""
    import torch

    _compile_settings(model, compiled=False)
    reqs = sharegpt_requests(args.num_requests, args.seed)
    budget = getattr(args, "token_budget", None) or None  # 0: bounded by time only
    g = torch.Generator().manual_seed(2)
    useful = done = generated = 0
    stopped = None
    t0 = time.perf_counter()
    for start in range(0, len(reqs), args.batch_size):
        if time.perf_counter() > deadline:
            stopped = "out of time"
        elif budget is not None and generated >= budget:
            stopped = f"token budget of {budget} generated tokens spent"
        if stopped:
            break
        batch = reqs[start : start + args.batch_size]
        width = max(p for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, (p, _) in enumerate(batch):  # left padding, as HF batches decoder-only prompts
            ids[i, width - p :] = torch.randint(0, cfg.vocab_size, (p,), generator=g)
            mask[i, width - p :] = 1
        longest = max(o for _, o in batch)
        _generate(model, ids.to(device), longest, device, attention_mask=mask.to(device))
        useful += sum(o for _, o in batch)
        generated += longest * len(batch)
        done += len(batch)
    seconds = time.perf_counter() - t0
    out = {"completed": done, "of": len(reqs), "batch_size": args.batch_size,
           "output_tokens": useful, "generated_tokens": generated, "token_budget": budget,
           "seconds": seconds, "partial": done < len(reqs), "stopped": stopped}  # fmt: skip
    if done == 0:
        return {**out, "output_throughput": None,
                "why_not": f"{stopped or 'no requests'} after 0 of {len(reqs)} requests"}  # fmt: skip
    return {**out, "output_throughput": useful / seconds}


def run_anchor(args) -> dict:
    import torch

    out_file = args.out / "anchor.json"
    result: dict = {"args": {k: v for k, v in vars(args).items() if k != "func"},
                    "decode": None, "throughput": None, "why_not": {}}  # fmt: skip
    t_start = time.perf_counter()
    deadline = t_start + args.budget_s
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError as exc:
        result["why_not"] = {"decode": f"transformers missing: {exc}",
                             "throughput": f"transformers missing: {exc}"}  # fmt: skip
        _write(out_file, result)
        return result
    device = torch.device(args.device)
    if device.type == "cpu":
        # As the engine and the decode bench do on a CPU: torch's worker threads spin-wait,
        # and on a loaded 2-core machine a batch-16 step of the tiny model took 2 s of wall
        # time on 0.1 s of CPU (the smoke test's anchor step near its cap).
        torch.set_num_threads(1)
    from cbbench.engine.torch.models.loader import resolve_dtype

    dtype = resolve_dtype(args.dtype)
    try:
        model, cfg = hf_model(args.model, dtype, device)
    except Exception as exc:  # noqa: BLE001
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        result["why_not"] = {"decode": why, "throughput": why}
        _write(out_file, result)
        return result
    # Decode first: the figure ratio_to_anchor needs most, and the compiled part; it gets
    # --decode-budget-s, the throughput part what is left of --budget-s after it.
    decode_deadline = min(deadline, time.perf_counter() + args.decode_budget_s)
    result["started_s"] = {"decode": round(time.perf_counter() - t_start, 3)}

    def keep(partial: dict) -> None:
        result["decode"] = partial
        _write(out_file, result)

    try:
        result["decode"] = decode_anchor(model, cfg, args, device, decode_deadline, keep)
    except Exception as exc:  # noqa: BLE001
        result["why_not"]["decode"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        result["decode_traceback"] = traceback.format_exc()
    _write(out_file, result)
    result["started_s"]["throughput"] = round(time.perf_counter() - t_start, 3)
    try:
        result["throughput"] = throughput_anchor(model, cfg, args, device, deadline)
        if result["throughput"]["output_throughput"] is None:
            result["why_not"]["throughput"] = result["throughput"]["why_not"]
    except Exception as exc:  # noqa: BLE001
        result["why_not"]["throughput"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        result["throughput_traceback"] = traceback.format_exc()
    _write(out_file, result)
    print(f"hf throughput: {result['throughput']}", flush=True)
    return result


def anchor_ratios(summary: dict, anchor: dict | None) -> dict:
    """cbbench / HF: decode step time (cbbench's graphs row, else eager; < 1 is faster) and
    output throughput (> 1 is faster), each null with the reason where a side is missing."""
    out: dict = {"decode_step_ms": {}, "output_throughput": {}, "why_not": {}}
    dec = (anchor or {}).get("decode") or {}
    hf_ms = dec.get("ms_per_step") or {}
    ours = summary.get("decode_step_ms") or {}
    for bs in DECODE_BATCHES:
        b = str(bs)
        mine = ((ours.get("graphs") or {}).get(b)) or ((ours.get("eager") or {}).get(b))
        theirs = hf_ms.get(b)
        out["decode_step_ms"][b] = mine / theirs if mine and theirs else None
        if out["decode_step_ms"][b] is None:
            out["why_not"][f"decode {b}"] = (
                "no cbbench decode time on a GPU" if not mine
                else (dec.get("why_not") or {}).get(b)
                or (anchor or {}).get("why_not", {}).get("decode") or "no HF decode time"
            )
    thr = ((anchor or {}).get("throughput") or {}).get("output_throughput")
    for run in ("continuous", "static"):
        mine = (summary.get(f"sharegpt_{run}") or {}).get("output_throughput")
        out["output_throughput"][run] = mine / thr if mine and thr else None
        if out["output_throughput"][run] is None:
            out["why_not"][f"throughput {run}"] = (
                f"no cbbench {run} run" if not mine
                else (anchor or {}).get("why_not", {}).get("throughput") or "no HF throughput"
            )
    return out
