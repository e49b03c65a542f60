"""GPU measurements for tests/gpu_check.sh (not collected by pytest), through cbbench's own classes.

``decode``: decode step time of a random-weight model (default llama-3-8b, bf16) at several batch
sizes, each request holding ``--context`` tokens of KV, with and without CUDA graphs, for the
fused layer kernels and the unfused ones side by side (``--fused both``), plus rows of the
``torch`` attention backend. For every row it reports

- ``step_ms``: one full ``ModelRunner.execute`` (host-side batch packing, forward, logits,
  sampling and the one host sync), as the engine sees an iteration;
- ``forward_ms``: the forward + logits of an already packed batch, back to back (GPU time);
- ``floor_ms``: the bytes one decode step must read over the GPU's peak HBM bandwidth: every
  weight except the input embedding table (decode reads only the batch's rows of it: Llama-3-8B
  bf16 reads 15.01 of its 16.06 GB, 3.13 ms at batch 1 on an H200's 4.8 TB/s), the batch's
  embedding rows, and batch x (context + 1) x KV bytes per token;
- ``mbu``: model bandwidth utilization = floor_ms / step time (``mbu_forward`` from forward_ms).

``backends_agree``: every attention backend that runs here against ``reference`` on the same
weights: a packed prefill of a few requests, then a decode step fed the *reference's* tokens,
the largest absolute logit difference of each.

Timing uses ``torch.cuda.Event`` on CUDA (``time.perf_counter`` on a CPU), ``--steps`` steps after
``--warmup`` untimed ones. The same decode step is replayed each time (the request is not
advanced), so the context stays exactly ``--context + 1`` keys; the KV cache holds zeros, which
costs the kernels exactly what real values would.

``env``, ``probe-triton``: see tests/gpu_check_env.py. ``summarize DIR``: see
tests/gpu_check_summary.py. ``run``: cbbench run's engine path without the Typer CLI (a
fallback when the CLI cannot import).

CPU smoke test (what can be checked without a GPU):

    python tests/bench_gpu.py decode --device cpu --model tiny --dry-run --out /tmp/gpu-dry
    python tests/bench_gpu.py summarize /tmp/gpu-dry
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

# Sibling modules (also under `python -P`, which leaves the script's folder off sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

H200_PEAK_BW = 4.8e12
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
AGREE_PROMPT_LENS = (5, 17, 33, 40)  # the backends_agree check's requests


# ---- the decode floor ---------------------------------------------------------------------------
def decode_weight_bytes(config, dtype: str) -> int:
    """Weight bytes one decode step reads, without the batch's embedding rows: every parameter
    except the input embedding table (an untied table is gathered at the batch's rows only; a
    tied one is the LM head, read whole)."""
    table = 0 if config.tie_word_embeddings else config.embedding_params
    return (config.num_params - table) * DTYPE_BYTES[dtype]


def decode_read_bytes(config, dtype: str, batch: int, context: int) -> int:
    """Bytes a decode step of ``batch`` rows, each attending ``context + 1`` keys, must read."""
    rows = 0 if config.tie_word_embeddings else batch * config.hidden_size * DTYPE_BYTES[dtype]
    kv = batch * (context + 1) * config.kv_bytes_per_token(dtype)
    return decode_weight_bytes(config, dtype) + rows + kv


def decode_floor_ms(config, dtype: str, batch: int, context: int, peak_bw: float) -> float:
    return decode_read_bytes(config, dtype, batch, context) / peak_bw * 1000.0


# ---- decode -----------------------------------------------------------------------------------
def _versions() -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        info["triton"] = f"unavailable: {exc}"
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
        free, total = torch.cuda.mem_get_info()
        info["memory_total_gib"] = round(total / 2**30, 1)
        info["memory_free_gib_at_start"] = round(free / 2**30, 1)
    return info


class _Timer:
    """CUDA events on a GPU, perf_counter on a CPU; ``elapsed_ms`` syncs."""

    def __init__(self, device) -> None:
        import torch

        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

    def __enter__(self):
        if self.cuda:
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.t1 = time.perf_counter()

    def elapsed_ms(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return self.start.elapsed_time(self.end)
        return (self.t1 - self.t0) * 1000.0


def _decode_requests(n: int, context: int, vocab: int, bm, seed: int):
    """``n`` requests one step into decoding: ``context`` prompt tokens cached, one output token
    known (its KV not yet written): every execute() is a pure-decode row with context + 1 keys."""
    import numpy as np

    from cbbench.engine.request import Request, RequestStatus

    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        ids = rng.integers(0, vocab, context).tolist()
        req = Request(i, context, 1 << 20, prompt_token_ids=ids)
        req.output_token_ids.append(int(rng.integers(0, vocab)))
        req.num_output_tokens = 1
        req.num_computed_tokens = context
        req.status = RequestStatus.RUNNING
        if not bm.allocate(req, context + 1):
            raise RuntimeError(f"KV pool too small for {n} x {context + 1} tokens")
        reqs.append(req)
    return reqs


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"mean": statistics.fmean(xs), "p50": statistics.median(xs), "min": xs[0], "max": xs[-1]}


def _error(errors: list, exc: BaseException, **where) -> None:
    errors.append({**where, "error": repr(exc), "traceback": traceback.format_exc()})
    print(f"{where} failed: {exc!r}", flush=True)


def _fused_configs(args, device) -> tuple[list[bool], str | None]:
    """Which layer-op configurations to time: fused needs Triton to run on the device."""
    from cbbench.kernels import available_backends

    wanted = {"both": [True, False], "on": [True], "off": [False]}[args.fused]
    if True in wanted and "triton" not in available_backends(device):
        why = "the fused Triton kernels cannot run here"
        return [f for f in wanted if not f] or [False], why
    return wanted, None


def run_decode(args) -> dict:
    import torch

    from cbbench.engine.gpu_specs import match_device_name
    from cbbench.engine.models.loader import resolve_dtype

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # as the engine does on a CPU (engine/build.py)
    dtype = resolve_dtype(args.dtype)
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    out: dict = {"env": _versions(), "args": {k: v for k, v in vars(args).items() if k != "func"}}
    out["device"] = device.type
    out["rows"] = []
    out["errors"] = errors = []
    gpu = match_device_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    peak_bw = args.peak_bw or (gpu.hbm_bandwidth if gpu else H200_PEAK_BW)
    out["peak_bw"] = peak_bw
    out["gpu_spec"] = gpu.to_dict() if gpu else None
    fused_list, why_not_fused = _fused_configs(args, device)
    if why_not_fused:
        out["fused_skipped"] = why_not_fused
    if device.type != "cuda":
        out["graphs_skipped"] = "CUDA graphs need a CUDA device"
    for fused in fused_list:
        try:
            _decode_config(args, out, device, dtype, dtype_name, peak_bw, gpu, fused,
                           args.attention_backend, args.batch_sizes, role="main")  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            _error(errors, exc, stage="config", fused=fused)
    # The torch attention backend too (issue 12 item 7): eager, unfused, the smaller batches.
    if args.torch_backend_rows:
        torch_bs = [b for b in args.batch_sizes if b <= args.torch_backend_max_batch] or [1]
        try:
            _decode_config(args, out, device, dtype, dtype_name, peak_bw, gpu, False, "torch",
                           torch_bs, role="torch_backend", graphs_variants=[False])  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            _error(errors, exc, stage="torch backend rows")
    try:
        out["backends_agree"] = backends_agree(args, device, dtype)
    except Exception as exc:  # noqa: BLE001
        _error(errors, exc, stage="backends_agree")
    if device.type == "cuda":
        out["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def _decode_config(args, out, device, dtype, dtype_name, peak_bw, gpu, fused, backend_name,
                   batch_sizes, role, graphs_variants=None) -> None:  # fmt: skip
    """Time every batch size (with and without graphs) for one model configuration; rows are
    tagged with ``role``: "main" (the configured backend) or "torch_backend" (extra rows)."""
    import torch

    from cbbench.engine.block_manager import BlockManager
    from cbbench.engine.cost_model import CostModel
    from cbbench.engine.model_runner import ModelRunner
    from cbbench.engine.models.llama import allocate_kv_cache
    from cbbench.engine.models.loader import load_model
    from cbbench.kernels import get_backend

    t0 = time.perf_counter()
    backend = get_backend(backend_name, device, block_size=args.block_size)
    model, config = load_model(
        args.model, dtype, device, backend, seed=0, max_model_len=args.max_model_len, fused=fused
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    label = f"{backend.name}{' fused' if fused else ''}"
    out.setdefault("model_build_s", {})[label] = time.perf_counter() - t0
    out.setdefault("attention_backends", []).append(backend.name)
    out["model_config"] = config.to_dict()
    out["weight_bytes"] = config.weight_bytes(dtype_name)
    out["decode_weight_bytes"] = decode_weight_bytes(config, dtype_name)
    out["kv_bytes_per_token"] = config.kv_bytes_per_token(dtype_name)
    out["min_step_ms_weights_only"] = decode_weight_bytes(config, dtype_name) / peak_bw * 1000
    cost_model = CostModel(config, dtype_name, gpu)
    max_bs = max(batch_sizes)
    blocks_per_req = -(-(args.context + 1) // args.block_size)
    num_blocks = max_bs * blocks_per_req + 1
    kv_caches = allocate_kv_cache(config, num_blocks, args.block_size, dtype, device)
    bm = BlockManager(num_blocks, args.block_size)
    if graphs_variants is None:
        graphs_variants = [False]
        if device.type == "cuda" and not args.no_graphs and backend.name == "triton":
            graphs_variants.append(True)
    for graphs in graphs_variants:
        t0 = time.perf_counter()
        try:
            runner = ModelRunner(
                model, config, kv_caches, args.block_size, device, dtype,
                use_cuda_graphs=graphs, max_num_seqs=max(max_bs, args.max_num_seqs),
                notice=lambda msg: print(msg, flush=True),
            )  # fmt: skip
            runner.warmup()
        except Exception as exc:  # noqa: BLE001
            _error(out["errors"], exc, stage="runner", graphs=graphs, fused=fused)
            continue
        if graphs:
            out.setdefault("graph_capture_s", {})[label] = time.perf_counter() - t0
            if not runner.cuda_graphs_effective:
                out.setdefault("graph_fallbacks", []).append(
                    f"{label}: CUDA graph capture failed, decode ran eagerly: "
                    f"{runner.graphs_fallback_reason}"
                )
        for bs in sorted(batch_sizes):
            try:
                row = _time_batch(args, runner, bs, bm, config, cost_model, peak_bw, dtype_name)
            except Exception as exc:  # noqa: BLE001
                _error(out["errors"], exc, graphs=graphs, fused=fused, batch_size=bs)
                continue
            row.update(graphs=graphs, fused=fused, attention_backend=backend.name, role=role)
            row["graph_replayed"] = graphs and runner.graphs.padded_size(bs) is not None
            out["rows"].append(row)
            print(
                f"{label:14s} bs {bs:4d} graphs {graphs!s:5}: step {row['step_ms']['mean']:.3f} "
                f"ms, forward {row['forward_ms']:.3f} ms, floor {row['floor_ms']:.3f} ms, MBU "
                f"{row['mbu']:.1%} (forward {row['mbu_forward']:.1%})",
                flush=True,
            )
        del runner
    del model, kv_caches
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _time_batch(args, runner, bs, bm, config, cost_model, peak_bw, dtype_name) -> dict:
    import torch

    from cbbench.engine.scheduler_output import SchedulerOutput

    device = runner.device
    reqs = _decode_requests(bs, args.context, config.vocab_size, bm, seed=bs)
    try:
        sched = SchedulerOutput(reqs, [1] * bs, bs, 0, bs)
        for _ in range(args.warmup):
            runner.execute(sched)
        step_ms = []
        for _ in range(args.steps):
            with _Timer(device) as t:
                runner.execute(sched)  # ends with the sampled tokens' host copy: a sync
            step_ms.append(t.elapsed_ms())
        batch = runner.prepare(sched)
        with torch.inference_mode():
            for _ in range(args.warmup):
                runner.compute_logits(batch)
            with _Timer(device) as t:
                for _ in range(args.steps):
                    runner.compute_logits(batch)
        forward_ms = t.elapsed_ms() / args.steps
    finally:
        for r in reqs:
            bm.free(r)
    floor = decode_floor_ms(config, dtype_name, bs, args.context, peak_bw)
    step = _stats(step_ms)
    return {
        "batch_size": bs,
        "context": args.context,
        "step_ms": step,
        "forward_ms": forward_ms,
        "tokens_per_s": bs / (step["mean"] / 1000),
        "bytes_read": decode_read_bytes(config, dtype_name, bs, args.context),
        "floor_ms": floor,
        "mbu": floor / step["mean"],
        "mbu_forward": floor / forward_ms,
        "bytes_cost_model": cost_model.iteration_cost(sched).bytes,
    }


def backends_agree(args, device, dtype) -> dict:
    """{backend: max |logits - reference logits|} over a packed prefill and one decode step
    fed the reference's tokens (issue 12 item 8: one argmax flip must not derail the check);
    None for a backend that cannot run here (the reason under ``why``)."""
    import torch

    from cbbench.engine.model_runner import ModelRunner
    from cbbench.engine.models.llama import allocate_kv_cache
    from cbbench.engine.models.loader import load_model
    from cbbench.engine.request import Request
    from cbbench.engine.scheduler_output import SchedulerOutput
    from cbbench.kernels import get_backend

    block = args.block_size
    result: dict = {"max_abs_diff": {}, "why": {}, "model": args.agree_model}
    reference_logits = reference_tokens = None
    for name in ("reference", "torch", "triton", "flash-attn"):
        try:
            backend = get_backend(name, device, block_size=block)
        except (RuntimeError, ValueError) as exc:
            result["max_abs_diff"][name] = None
            result["why"][name] = str(exc).splitlines()[0][:200]
            continue
        model, config = load_model(args.agree_model, dtype, device, backend, seed=0,
                                   max_model_len=args.max_model_len)  # fmt: skip
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
        del runner, model, kv
    return result


def cmd_decode(args) -> int:
    if args.dry_run:
        args.batch_sizes = [1, 4]
        args.context = min(args.context, 40)
        args.steps = min(args.steps, 3)
        args.warmup = min(args.warmup, 1)
    if args.agree_model is None:
        args.agree_model = args.model
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_decode(args)
    except Exception as exc:  # noqa: BLE001
        result = {
            "fatal": repr(exc),
            "traceback": traceback.format_exc(),
            "rows": [],
            "args": {k: str(v) for k, v in vars(args).items() if k != "func"},
        }
        print(result["traceback"], file=sys.stderr)
    args.out.joinpath("decode.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    if result.get("rows"):
        from gpu_check_summary import decode_markdown

        args.out.joinpath("decode.md").write_text(decode_markdown(result))
    ok = bool(result.get("rows")) and not result.get("errors") and "fatal" not in result
    print(f"decode bench {'ok' if ok else 'FAILED'} -> {args.out / 'decode.json'}")
    return 0 if ok else 1


# ---- env and the Triton probe -------------------------------------------------------------------
def cmd_env(args) -> int:
    """What is importable, with versions: the GPU machine has no internet, so this is what the
    check can use. Standard library only until it probes."""
    from gpu_check_env import collect_env

    info = collect_env()
    for k, v in info["modules"].items():
        print(f"  {k:18s} {v}")
    print("missing:", ", ".join(info["missing_modules"]) or "none")
    print("C compiler:", info["c_compiler"]["version"], "| Python.h:", info["python_h"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(info, indent=2) + "\n")
    return 0


def cmd_probe_triton(args) -> int:
    """Exit 0 when one Triton kernel launched on the device; else print the reason, exit 1."""
    from gpu_check_env import probe_triton

    reason = probe_triton(args.device)
    print("triton launch: ok" if reason is None else f"triton launch FAILED: {reason}")
    return 0 if reason is None else 1


# ---- run (a fallback for `cbbench run` when the CLI cannot import) -----------------------------
def cmd_run(args) -> int:
    """``cbbench run``'s engine path without the Typer CLI: RunSpec -> execute_run -> result."""
    from cbbench.analysis.result import write_result
    from cbbench.bench.runner import RunSpec, execute_run
    from cbbench.engine.args import EngineArgs

    opts = EngineArgs(
        engine=args.engine, model=args.model, device=args.device, scheduler=args.scheduler,
        attention_backend=args.attention_backend, cuda_graphs=args.cuda_graphs,
        fused_kernels=args.fused_kernels,
    )  # fmt: skip
    spec = RunSpec(
        workload=args.workload, num_requests=args.num_requests, label=args.label, engine=opts
    )

    def notice(msg: str) -> None:
        print(f"cbbench: {msg}", file=sys.stderr)

    result = execute_run(spec, notice)
    write_result(args.output, result)
    s = result["summary"]
    print(
        f"completed {s.get('completed')} failed {s.get('failed')} "
        f"output tok/s {s.get('output_throughput')} -> {args.output}"
    )
    return 0


def cmd_summarize(args) -> int:
    from gpu_check_summary import summarize_folder

    summarize_folder(args.folder)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="GPU measurements for tests/gpu_check.sh")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("decode", help="decode step time, floor and MBU per batch size")
    d.add_argument("--device", default="cuda")
    d.add_argument("--model", default="llama-3-8b")
    d.add_argument("--dtype", default="bf16")
    d.add_argument("--attention-backend", default="auto")
    d.add_argument("--fused", choices=("both", "on", "off"), default="both",
                   help="layer kernels to time: fused, unfused, or both side by side")
    d.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256]
    )
    d.add_argument("--context", type=int, default=512, help="KV tokens per request")
    d.add_argument("--steps", type=int, default=20)
    d.add_argument("--warmup", type=int, default=3)
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument(
        "--max-model-len", type=int, default=None,
        help="default: the model's (as cbbench run; sizes graph block tables)",
    )  # fmt: skip
    d.add_argument("--max-num-seqs", type=int, default=256, help="CUDA graph ladder cap")
    d.add_argument("--no-graphs", action="store_true")
    d.add_argument("--no-torch-backend-rows", dest="torch_backend_rows", action="store_false")
    d.add_argument("--torch-backend-max-batch", type=int, default=16)
    d.add_argument("--agree-model", default=None, help="backends_agree's model (default --model)")
    d.add_argument("--peak-bw", type=float, default=None, help="B/s; default: the GPU's spec")
    d.add_argument(
        "--dry-run", action="store_true",
        help="batch 1 and 4, context <= 40, 3 steps: a smoke test (CPU, tiny)",
    )  # fmt: skip
    d.add_argument("--out", type=Path, required=True)
    d.set_defaults(func=cmd_decode)
    e = sub.add_parser("env", help="importable modules, compiler, Python.h (no cbbench needed)")
    e.add_argument("--out", type=Path, default=None)
    e.set_defaults(func=cmd_env)
    p = sub.add_parser("probe-triton", help="launch one Triton kernel; exit 1 if it fails")
    p.add_argument("--device", default="cuda")
    p.set_defaults(func=cmd_probe_triton)
    r = sub.add_parser("run", help="cbbench run's engine path without the CLI (a fallback)")
    r.add_argument("--workload", default="sharegpt")
    r.add_argument("--engine", default="torch")
    r.add_argument("--device", default=None)
    r.add_argument("--model", default=None)
    r.add_argument("--num-requests", type=int, default=1000)
    r.add_argument("--scheduler", default="continuous")
    r.add_argument("--attention-backend", default="auto")
    r.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    r.add_argument("--fused-kernels", default="auto")
    r.add_argument("--label", default=None)
    r.add_argument("--output", type=Path, required=True)
    r.set_defaults(func=cmd_run)
    s = sub.add_parser("summarize", help="summary.json + summary.md from a gpu_check folder")
    s.add_argument("folder", type=Path)
    s.set_defaults(func=cmd_summarize)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
