"""GPU measurements for tests/gpu/gpu_check.sh (not collected by pytest), through cbbench's own classes.

``decode``: decode step time, floor and MBU of a random-weight model at several batch sizes,
with and without CUDA graphs, fused and unfused layer kernels side by side, ``torch``-backend
rows, and every backend's logits against ``reference`` (tests/gpu/gpu_check_decode.py,
tests/gpu/gpu_check_agree.py). ``env``, ``probe-triton``: see tests/gpu/gpu_check_env.py.
``anchor``: Hugging Face generate on the same device (tests/gpu/gpu_check_anchor.py).
``summarize DIR``: see tests/gpu/gpu_check_summary.py. ``run`` and ``calibrate``: cbbench run's
engine path and cbbench calibrate without the Typer CLI (fallbacks when the CLI cannot import).

CPU smoke test (what can be checked without a GPU):

    python tests/gpu/bench_gpu.py decode --device cpu --model tiny --dry-run --out /tmp/gpu-dry
    python tests/gpu/bench_gpu.py summarize /tmp/gpu-dry
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

# Sibling modules (also under `python -P`, which leaves the script's folder off sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent))


def cmd_decode(args) -> int:
    if args.dry_run:
        args.batch_sizes = [1, 4]
        args.context = min(args.context, 40)
        args.steps = min(args.steps, 3)
        args.warmup = min(args.warmup, 1)
    if args.agree_model is None:
        args.agree_model = args.model
    args.out.mkdir(parents=True, exist_ok=True)
    from gpu_check_decode import run_decode

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
    from cbbench.errors import UsageError
    from cbbench.options import LoadOptions, OutputOptions

    opts = EngineArgs(
        engine=args.engine, model=args.model, device=args.device, batching=args.scheduler,
        attention_backend=args.attention_backend, cuda_graphs=args.cuda_graphs,
        fused_kernels=args.fused_kernels, gpu_profile=args.gpu_profile,
        **({"max_num_seqs": args.max_num_seqs} if args.max_num_seqs is not None else {}),
    )  # fmt: skip
    load = LoadOptions(workload=args.workload, num_requests=args.num_requests,
                       request_rate=args.request_rate, seed=args.seed,
                       replay=Path(args.replay) if args.replay is not None else None)
    spec = RunSpec(load, opts, OutputOptions(label=args.label))

    from cbbench.cli import logs

    logs.install()  # the notices as `cbbench: ...` lines, as the CLI prints them
    try:
        result = execute_run(spec)
    except (UsageError, ValueError) as exc:  # EngineArgsError is a ValueError
        print(f"cbbench: error: {exc}", file=sys.stderr)
        return 2
    write_result(args.output, result)
    s = result.summary
    print(
        f"completed {s.completed} failed {s.failed} "
        f"output tok/s {s.output_throughput} -> {args.output}"
    )
    return 0


def cmd_calibrate(args) -> int:
    """``cbbench calibrate RESULT... --out PROFILE`` without the Typer CLI."""
    from cbbench.analysis.calibration import calibrate
    from cbbench.analysis.result import dumps, write_atomic
    from cbbench.errors import UsageError
    from cbbench.schema import read_run

    try:
        profile = calibrate([(str(p), read_run(p)) for p in args.results])
    except UsageError as exc:
        print(f"cbbench: error: {exc}", file=sys.stderr)
        return 2
    write_atomic(args.out, dumps(profile) + "\n")
    print(f"profile of {profile['device']} from {profile['num_iterations']} iterations -> {args.out}")
    return 0


def cmd_anchor(args) -> int:
    """Hugging Face generate on the same device (tests/gpu/gpu_check_anchor.py) -> anchor.json."""
    from gpu_check_anchor import run_anchor

    args.out.mkdir(parents=True, exist_ok=True)
    result = run_anchor(args)
    ok = result.get("decode") is not None or result.get("throughput") is not None
    print(f"anchor {'ok' if ok else 'FAILED'}: why not {result.get('why_not')}")
    return 0 if ok else 1


def cmd_summarize(args) -> int:
    from gpu_check_summary import summarize_folder

    summarize_folder(args.folder)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="GPU measurements for tests/gpu/gpu_check.sh")
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
    d.add_argument("--peak-flops", type=float, default=None,
                   help="FLOP/s; default: the GPU's dense bf16 spec")
    d.add_argument("--seed", type=int, default=0, help="the KV cache's random fill")
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
    r.add_argument("--seed", type=int, default=0, help="as cbbench run's --seed")
    r.add_argument("--scheduler", default="continuous")
    r.add_argument("--max-num-seqs", type=int, default=None)
    r.add_argument("--request-rate", default="inf", help="req/s (Poisson arrivals), or inf")
    r.add_argument("--attention-backend", default="auto")
    r.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    r.add_argument("--fused-kernels", default="auto")
    r.add_argument("--label", default=None)
    r.add_argument("--gpu-profile", default=None)
    r.add_argument("--replay", default=None)
    r.add_argument("--output", type=Path, required=True)
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("calibrate", help="cbbench calibrate without the CLI (a fallback)")
    c.add_argument("results", type=Path, nargs="+")
    c.add_argument("--out", type=Path, required=True)
    c.set_defaults(func=cmd_calibrate)
    a = sub.add_parser("anchor", help="HF generate on the same device: decode ms, throughput")
    a.add_argument("--device", default="cuda")
    a.add_argument("--model", default="llama-3-8b")
    a.add_argument("--dtype", default="bf16")
    a.add_argument("--context", type=int, default=512, help="decode: prompt tokens (as decode)")
    a.add_argument("--short", type=int, default=16, help="decode: new tokens, first run")
    a.add_argument("--long", type=int, default=80, help="decode: new tokens, second run")
    a.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="torch.compile the decode forward (auto: on CUDA)")
    a.add_argument("--num-requests", type=int, default=200, help="throughput: ShareGPT requests")
    a.add_argument("--seed", type=int, default=0, help="throughput: the run's --seed")
    a.add_argument("--batch-size", type=int, default=64, help="throughput: static batch size")
    a.add_argument("--budget-s", type=float, default=1e9,
                   help="the whole step: the throughput part stops starting batches after "
                        "this many seconds from the start")
    a.add_argument("--decode-budget-s", type=float, default=150.0,
                   help="decode (first): start no batch size after this many seconds, "
                        "compilation included")
    a.add_argument("--token-budget", type=int, default=50_000,
                   help="throughput: stop starting batches once this many tokens were "
                        "generated (padding included); 0: time only")
    a.add_argument("--out", type=Path, required=True)
    a.set_defaults(func=cmd_anchor)
    s = sub.add_parser("summarize", help="summary.json + summary.md from a gpu_check folder")
    s.add_argument("folder", type=Path)
    s.set_defaults(func=cmd_summarize)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
