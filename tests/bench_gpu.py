"""GPU measurements for tests/gpu_check.sh (not collected by pytest), through cbbench's own classes.

Two subcommands:

``decode``: decode step time of a random-weight model (default llama-3-8b, bf16) at several batch
sizes, each request holding ``--context`` tokens of KV, with and without CUDA graphs. For every
(batch size, graphs) pair it reports

- ``step_ms``: one full ``ModelRunner.execute`` (host-side batch packing, forward, logits,
  sampling and the one host sync), as the engine sees an iteration;
- ``forward_ms``: the forward + logits of an already packed batch, back to back (GPU time);
- ``mbu``: model bandwidth utilization = (weight bytes + KV bytes read) / step time / peak HBM
  bandwidth (4.8e12 B/s on an H200), from ``forward_ms`` and from ``step_ms``; weights are
  ``ModelConfig.weight_bytes`` (DESIGN.md's figure, embedding table included), KV read is
  batch x (context + 1) x KV bytes per token. ``mbu_cost_model`` uses the engine's analytic
  ``CostModel`` bytes for the same batch instead.

Timing uses ``torch.cuda.Event`` on CUDA (``time.perf_counter`` on a CPU), ``--steps`` steps after
``--warmup`` untimed ones. The same decode step is replayed each time (the request is not
advanced), so the context stays exactly ``--context + 1`` keys; the KV cache holds zeros, which
costs the kernels exactly what real values would.

``summarize DIR``: gather what gpu_check.sh left in DIR (steps.tsv, env.json, decode.json, the
pytest log, the two ShareGPT results) into DIR/summary.json and DIR/summary.md.

CPU smoke test of both (what can be checked without a GPU):

    python tests/bench_gpu.py decode --device cpu --model tiny --dry-run --out /tmp/gpu-dry
    python tests/bench_gpu.py summarize /tmp/gpu-dry
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

H200_PEAK_BW = 4.8e12


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
    return {
        "mean": statistics.fmean(xs),
        "p50": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
    }


def run_decode(args) -> dict:
    import torch

    from cbbench.engine.block_manager import BlockManager
    from cbbench.engine.cost_model import CostModel
    from cbbench.engine.gpu_specs import match_device_name
    from cbbench.engine.model_runner import ModelRunner
    from cbbench.engine.models.llama import allocate_kv_cache
    from cbbench.engine.models.loader import load_model, resolve_dtype
    from cbbench.engine.scheduler_output import SchedulerOutput
    from cbbench.kernels import get_backend

    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype)
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    batch_sizes = sorted(args.batch_sizes)
    out: dict = {"env": _versions(), "args": {k: v for k, v in vars(args).items() if k != "func"}}
    out["rows"] = rows = []
    out["errors"] = errors = []

    t0 = time.perf_counter()
    backend = get_backend(args.attention_backend, device, block_size=args.block_size)
    model, config = load_model(
        args.model, dtype, device, backend, seed=0, max_model_len=args.max_model_len
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    out["model_build_s"] = time.perf_counter() - t0
    out["attention_backend"] = backend.name
    out["model_config"] = config.to_dict()
    gpu = match_device_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    peak_bw = args.peak_bw or (gpu.hbm_bandwidth if gpu else H200_PEAK_BW)
    out["peak_bw"] = peak_bw
    out["gpu_spec"] = gpu.to_dict() if gpu else None
    weight_bytes = config.weight_bytes(dtype_name)
    kv_per_token = config.kv_bytes_per_token(dtype_name)
    out["weight_bytes"] = weight_bytes
    out["kv_bytes_per_token"] = kv_per_token
    out["min_step_ms_weights_only"] = weight_bytes / peak_bw * 1000
    cost_model = CostModel(config, dtype_name, gpu)

    max_bs = batch_sizes[-1]
    blocks_per_req = -(-(args.context + 1) // args.block_size)
    num_blocks = max_bs * blocks_per_req + 1
    kv_caches = allocate_kv_cache(config, num_blocks, args.block_size, dtype, device)
    out["num_kv_blocks"] = num_blocks
    bm = BlockManager(num_blocks, args.block_size)

    variants = [False]
    if device.type == "cuda" and not args.no_graphs:
        variants.append(True)
    elif device.type != "cuda":
        out["graphs_skipped"] = "CUDA graphs need a CUDA device"

    for graphs in variants:
        t0 = time.perf_counter()
        try:
            runner = ModelRunner(
                model, config, kv_caches, args.block_size, device, dtype,
                use_cuda_graphs=graphs, max_num_seqs=max(max_bs, args.max_num_seqs),
            )  # fmt: skip
            runner.warmup()
        except Exception as exc:  # noqa: BLE001
            errors.append(
                {
                    "graphs": graphs,
                    "stage": "runner",
                    "error": repr(exc),
                    "traceback": traceback.format_exc(),
                }
            )
            print(f"runner (graphs={graphs}) failed: {exc!r}", flush=True)
            continue
        setup_s = time.perf_counter() - t0
        if graphs:
            out["graph_capture_s"] = setup_s
            out["graph_batch_sizes"] = sorted(getattr(runner, "_graphs", {}))
        for bs in batch_sizes:
            try:
                rows.append(
                    _time_batch(args, runner, bs, graphs, bm, config, cost_model, peak_bw,
                                weight_bytes, kv_per_token, device, SchedulerOutput)
                )  # fmt: skip
                r = rows[-1]
                print(
                    f"bs {bs:4d} graphs {graphs!s:5}: step {r['step_ms']['mean']:.3f} ms, "
                    f"forward {r['forward_ms']:.3f} ms, MBU {r['mbu_forward']:.1%} "
                    f"(step {r['mbu_step']:.1%}), {r['tokens_per_s']:.0f} tok/s",
                    flush=True,
                )
            except Exception as exc:  # noqa: BLE001
                errors.append(
                    {
                        "graphs": graphs,
                        "batch_size": bs,
                        "error": repr(exc),
                        "traceback": traceback.format_exc(),
                    }
                )
                print(f"bs {bs} graphs {graphs} failed: {exc!r}", flush=True)
        del runner
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if device.type == "cuda":
        out["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def _time_batch(args, runner, bs, graphs, bm, config, cost_model, peak_bw, weight_bytes,
                kv_per_token, device, SchedulerOutput) -> dict:  # fmt: skip
    import torch

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
        graphs_held = getattr(runner, "_graphs", {})
        used_graph = bool(graphs_held) and batch.is_pure_decode and bs <= max(graphs_held)
    finally:
        for r in reqs:
            bm.free(r)
    kv_read = bs * (args.context + 1) * kv_per_token
    moved = weight_bytes + kv_read
    model_bytes = cost_model.iteration_cost(sched).bytes
    step = _stats(step_ms)
    return {
        "batch_size": bs,
        "graphs": graphs,
        "graph_replayed": used_graph,
        "context": args.context,
        "step_ms": step,
        "forward_ms": forward_ms,
        "tokens_per_s": bs / (step["mean"] / 1000),
        "bytes_weights": weight_bytes,
        "bytes_kv_read": kv_read,
        "mbu_forward": moved / (forward_ms / 1000) / peak_bw,
        "mbu_step": moved / (step["mean"] / 1000) / peak_bw,
        "bytes_cost_model": model_bytes,
        "mbu_cost_model_forward": model_bytes / (forward_ms / 1000) / peak_bw,
    }


def decode_markdown(d: dict) -> str:
    env = d["env"]
    lines = [
        f"Decode step, {d['args']['model']} random weights, {d['args']['dtype']}, "
        f"{d.get('attention_backend')} attention, context {d['args']['context']} tokens/request, "
        f"{d['args']['steps']} timed steps after {d['args']['warmup']} warm-up; "
        f"{env.get('device_name', d['args']['device'])}, torch {env['torch']}, "
        f"triton {env.get('triton')}. MBU = (weights {d['weight_bytes'] / 1e9:.2f} GB + KV read) / "
        f"time / {d['peak_bw'] / 1e12:.2f} TB/s (weights alone: >= "
        f"{d['min_step_ms_weights_only']:.2f} ms/step).",
        "",
        "| batch | CUDA graphs | step ms (mean / p50 / min) | forward ms | MBU (forward) | "
        "MBU (step) | MBU (cost-model bytes) | tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        s = r["step_ms"]
        lines.append(
            f"| {r['batch_size']} | {'yes' if r['graphs'] else 'no'} | {s['mean']:.3f} / "
            f"{s['p50']:.3f} / {s['min']:.3f} | {r['forward_ms']:.3f} | {r['mbu_forward']:.1%} | "
            f"{r['mbu_step']:.1%} | {r['mbu_cost_model_forward']:.1%} | "
            f"{r['tokens_per_s']:.0f} |"
        )
    if d.get("graph_capture_s") is not None:
        lines.append(
            f"\nCUDA graph capture ({len(d.get('graph_batch_sizes', []))} sizes): "
            f"{d['graph_capture_s']:.1f} s."
        )
    if d.get("graphs_skipped"):
        lines.append(f"\nCUDA graphs not measured: {d['graphs_skipped']}.")
    for e in d.get("errors", []):
        lines.append(f"\nERROR {e}".split("\n", 2)[1][:400])
    return "\n".join(lines) + "\n"


def cmd_decode(args) -> int:
    if args.dry_run:
        args.batch_sizes = [1, 4]
        args.context = min(args.context, 40)
        args.steps = min(args.steps, 3)
        args.warmup = min(args.warmup, 1)
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
        args.out.joinpath("decode.md").write_text(decode_markdown(result))
    ok = bool(result.get("rows")) and not result.get("errors") and "fatal" not in result
    print(f"decode bench {'ok' if ok else 'FAILED'} -> {args.out / 'decode.json'}")
    return 0 if ok else 1


# ---- env (standard library only until it probes) ----------------------------------------------
ENV_MODULES = (
    "torch", "triton", "numpy", "typer", "click", "aiohttp", "httpx", "tabulate", "safetensors", "rich",
    "fastapi", "uvicorn", "prometheus_client", "matplotlib", "pynvml", "transformers",
    "flash_attn", "pytest", "pytest_timeout", "hypothesis", "setuptools", "pip", "wheel", "cbbench",
)  # fmt: skip
DIST_NAMES = {
    "pynvml": "nvidia-ml-py",
    "prometheus_client": "prometheus-client",
    "flash_attn": "flash-attn",
    "pytest_timeout": "pytest-timeout",
}


def cmd_env(args) -> int:
    """What is importable, with versions: the GPU machine has no internet, so this is what the
    check can use."""
    import importlib
    import importlib.metadata as md

    info: dict = {"python": platform.python_version(), "executable": sys.executable, "modules": {}}
    for name in ENV_MODULES:
        try:
            mod = importlib.import_module(name)
            try:
                v = md.version(DIST_NAMES.get(name, name))
            except Exception:  # noqa: BLE001
                v = getattr(mod, "__version__", "?")
            info["modules"][name] = str(v)
        except Exception as exc:  # noqa: BLE001
            info["modules"][name] = f"MISSING ({type(exc).__name__}: {str(exc)[:160]})"
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["device_name"] = torch.cuda.get_device_name(0)
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            props = torch.cuda.get_device_properties(0)
            info["memory_gib"] = round(props.total_memory / 2**30, 1)
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = repr(exc)
    for k, v in info["modules"].items():
        print(f"  {k:18s} {v}")
    print({k: v for k, v in info.items() if k != "modules"})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(info, indent=2) + "\n")
    return 0


# ---- run (a fallback for `cbbench run` when typer is missing) -----------------------------------
def cmd_run(args) -> int:
    """``cbbench run``'s engine path without the Typer CLI: RunSpec -> execute_run -> result."""
    from cbbench.analysis.result import write_result
    from cbbench.bench.runner import RunSpec, execute_run
    from cbbench.engine.args import EngineArgs

    opts = EngineArgs(
        engine=args.engine, model=args.model, device=args.device, scheduler=args.scheduler
    )
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


# ---- summarize --------------------------------------------------------------------------------
def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except Exception:  # noqa: BLE001
        return None


def _steps(folder: Path) -> list[dict]:
    rows = []
    f = folder / "steps.tsv"
    if f.is_file():
        for line in f.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0] != "step":
                rows.append(
                    {
                        "step": parts[0],
                        "rc": parts[1],
                        "seconds": parts[2],
                        "limit_s": parts[3],
                        "note": parts[4] if len(parts) > 4 else "",
                    }
                )
    return rows


def _pytest_line(folder: Path) -> str | None:
    f = folder / "pytest_cuda.log"
    if not f.is_file():
        return None
    lines = [ln.strip() for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if any(w in ln for w in (" passed", " failed", " skipped", " error", "no tests ran")):
            return ln.strip("= ")
    return lines[-1] if lines else None


def _run_summary(path: Path) -> dict | None:
    d = _load(path)
    if not isinstance(d, dict) or "summary" not in d:
        return None
    s = d["summary"]
    eng = s.get("engine", {}) or {}

    def dist(key):
        v = s.get(key) or {}
        return {k: v.get(k) for k in ("mean", "p50", "p99")} if isinstance(v, dict) else None

    cfg = d.get("config", {})
    return {
        "file": path.name,
        "scheduler": cfg.get("scheduler"),
        "attention_backend": cfg.get("attention_backend"),
        "cuda_graphs": cfg.get("cuda_graphs"),
        "interrupted": d.get("interrupted"),
        "completed": s.get("completed"),
        "failed": s.get("failed"),
        "duration_s": s.get("duration_s"),
        "request_throughput": s.get("request_throughput"),
        "output_throughput": s.get("output_throughput"),
        "total_token_throughput": s.get("total_token_throughput"),
        "ttft_ms": dist("ttft_ms"),
        "tpot_ms": dist("tpot_ms"),
        "itl_ms": dist("itl_ms"),
        "e2el_ms": dist("e2el_ms"),
        "num_iterations": eng.get("num_iterations"),
        "mean_iteration_ms": eng.get("mean_iteration_ms"),
        "mbu": eng.get("mbu"),
        "decode_mbu": eng.get("decode_mbu"),
        "mfu": eng.get("mfu"),
        "telemetry": _telemetry_summary(d.get("telemetry") or {}),
    }


def _telemetry_summary(tel: dict) -> dict:
    """Issue 5's questions: did GPM work on this GPU (metric), and how does the measured DRAM
    bandwidth utilization compare with the analytic MBU over the steady state."""
    steady = ((tel.get("summary") or {}).get("steady") or {}).get("dram_bw_util_pct") or {}
    return {
        "available": tel.get("available"),
        "reason": tel.get("reason"),
        "error": tel.get("error"),
        "metric": tel.get("metric"),  # dram_bw_util_gpm means GPM works here
        "num_samples": len(tel.get("samples") or []),
        "steady_dram_bw_util_pct_mean": steady.get("mean"),
        "steady_dram_bw_util_pct_p90": steady.get("p90"),
    }


def _f(x, fmt="{:.1f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return fmt.format(x) if isinstance(x, (int, float)) else str(x)


def cmd_summarize(args) -> int:
    folder: Path = args.folder
    summary = {
        "folder": str(folder),
        "steps": _steps(folder),
        "env": _load(folder / "env.json"),
        "pytest_cuda": _pytest_line(folder),
        "decode": _load(folder / "decode.json"),
        "sharegpt_continuous": _run_summary(folder / "sharegpt_h200.json"),
        "sharegpt_static": _run_summary(folder / "sharegpt_h200_static.json"),
    }
    c, s = summary["sharegpt_continuous"], summary["sharegpt_static"]
    if c and s and c.get("output_throughput") and s.get("output_throughput"):
        summary["continuous_over_static_output_throughput"] = (
            c["output_throughput"] / s["output_throughput"]
        )
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")

    md = ["# GPU check summary", ""]
    env = summary["env"] or {}
    if env:
        md.append(
            "Environment: "
            + ", ".join(f"{k} {v}" for k, v in env.items() if not isinstance(v, (dict, list)))
        )
        md.append("")
    md += ["| step | rc | seconds | limit | note |", "|---|---|---|---|---|"]
    md += [
        f"| {r['step']} | {r['rc']} | {r['seconds']} | {r['limit_s']} | {r['note']} |"
        for r in summary["steps"]
    ]
    md += ["", f"pytest -m cuda: {summary['pytest_cuda'] or 'no log'}", ""]
    dec = summary["decode"]
    if isinstance(dec, dict) and dec.get("rows"):
        md += ["## Decode step", "", decode_markdown(dec)]
    elif isinstance(dec, dict):
        md += ["## Decode step", "", f"no rows: {dec.get('fatal') or dec.get('errors')}", ""]
    md += [
        "## ShareGPT runs (cbbench run --engine torch)",
        "",
        "| run | completed / failed | duration s | out tok/s | req/s | TTFT p50 / p99 ms | "
        "TPOT p50 / p99 ms | iterations | decode MBU | interrupted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in (("continuous", c), ("static", s)):
        if not r:
            md.append(f"| {name} | no result | | | | | | | | |")
            continue
        t, p = r["ttft_ms"] or {}, r["tpot_ms"] or {}
        md.append(
            f"| {name} | {r['completed']} / {r['failed']} | {_f(r['duration_s'])} | "
            f"{_f(r['output_throughput'], '{:.0f}')} | {_f(r['request_throughput'], '{:.2f}')} | "
            f"{_f(t.get('p50'))} / {_f(t.get('p99'))} | {_f(p.get('p50'), '{:.2f}')} / "
            f"{_f(p.get('p99'), '{:.2f}')} | {_f(r['num_iterations'], '{}')} | "
            f"{_f(r['decode_mbu'], '{:.1%}')} | {r['interrupted']} |"
        )
    md += [
        "",
        "## GPU telemetry (NVML) vs analytic MBU",
        "",
        "| run | telemetry | metric | samples | measured DRAM BW util mean / p90 (steady) | "
        "analytic MBU / decode MBU |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("continuous", c), ("static", s)):
        tel = (r or {}).get("telemetry") or {}
        md.append(
            f"| {name} | {tel.get('available')} {tel.get('reason') or ''} | {tel.get('metric')} | "
            f"{tel.get('num_samples')} | {_f(tel.get('steady_dram_bw_util_pct_mean'))}% / "
            f"{_f(tel.get('steady_dram_bw_util_pct_p90'))}% | "
            f"{_f((r or {}).get('mbu'), '{:.1%}')} / {_f((r or {}).get('decode_mbu'), '{:.1%}')} |"
        )
    if "continuous_over_static_output_throughput" in summary:
        md += [
            "",
            "Continuous / static output throughput: "
            f"{summary['continuous_over_static_output_throughput']:.2f}x",
        ]
    (folder / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="GPU measurements for tests/gpu_check.sh")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("decode", help="decode step time and MBU per batch size")
    d.add_argument("--device", default="cuda")
    d.add_argument("--model", default="llama-3-8b")
    d.add_argument("--dtype", default="bf16")
    d.add_argument("--attention-backend", default="auto")
    d.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256]
    )
    d.add_argument("--context", type=int, default=512, help="KV tokens per request")
    d.add_argument("--steps", type=int, default=20)
    d.add_argument("--warmup", type=int, default=3)
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="default: the model's (as cbbench run; sizes graph block tables)",
    )
    d.add_argument("--max-num-seqs", type=int, default=256, help="CUDA graph ladder cap")
    d.add_argument("--no-graphs", action="store_true")
    d.add_argument("--peak-bw", type=float, default=None, help="B/s; default: the GPU's spec")
    d.add_argument(
        "--dry-run",
        action="store_true",
        help="batch 1 and 4, context <= 40, 3 steps: a smoke test (CPU, tiny)",
    )
    d.add_argument("--out", type=Path, required=True)
    d.set_defaults(func=cmd_decode)
    e = sub.add_parser("env", help="importable modules and versions (no cbbench needed)")
    e.add_argument("--out", type=Path, default=None)
    e.set_defaults(func=cmd_env)
    r = sub.add_parser("run", help="cbbench run's engine path without typer (a fallback)")
    r.add_argument("--workload", default="sharegpt")
    r.add_argument("--engine", default="torch")
    r.add_argument("--device", default=None)
    r.add_argument("--model", default=None)
    r.add_argument("--num-requests", type=int, default=1000)
    r.add_argument("--scheduler", default="continuous")
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
