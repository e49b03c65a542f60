"""`cbbench forward`: the bundled engine's step time at exact shapes (decode batches at a
context, prefill chunks), CUDA graphs on and off, beside the roofline floor, MBU/MFU and the
per-operator table (cbbench/bench/forward.py)."""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cbbench.errors import UsageError
from cbbench.options import output_file

if TYPE_CHECKING:
    from cbbench.schema import ForwardResult

DEFAULT_MODEL_GPU = "llama-3-8b"  # on a GPU; a CPU gets forward.CPU_PRESETS[0]


def register(app: typer.Typer) -> None:
    app.command("forward")(forward)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got {text!r}") from None


def forward(
    model: Annotated[str | None, typer.Option(
        help="A model preset or a Hugging Face folder (random weights of its shape). Default: "
        "llama-3-8b on a GPU, tiny on a CPU (a CPU runs the small presets only).")] = None,
    device: Annotated[str, typer.Option(help="cuda, cuda:N, cpu, or auto (cuda when there "
                                        "is one).")] = "auto",
    batch_sizes: Annotated[str, typer.Option(
        help="Decode batch sizes, comma-separated; each row attends --context + 1 keys. "
        "Empty: no decode rows.", metavar="LIST")] = "1,16,64,256",
    context: Annotated[int, typer.Option(help="Cached tokens per decode row.")] = 512,
    prefill_tokens: Annotated[str, typer.Option(
        help="Prefill chunk sizes (tokens of one request, none cached), comma-separated. "
        "Empty: no prefill rows.", metavar="LIST")] = "2048",
    dtype: Annotated[str, typer.Option(help="bf16, fp16 or fp32.")] = "bf16",
    steps: Annotated[int, typer.Option(help="Timed steps per shape.")] = 20,
    warmup: Annotated[int, typer.Option(help="Untimed steps before them.")] = 3,
    cuda_graphs: Annotated[str, typer.Option(
        help="Decode rows with CUDA graphs: both (with and without, side by side), on, off, "
        "auto (on). A CPU has none.", metavar="both|on|off|auto")] = "both",
    gpu: Annotated[str | None, typer.Option(
        help="The GPU whose peaks set the floor (default: the device's; on a CPU, h100 for "
        "reference).")] = None,
    peak_bw: Annotated[float | None, typer.Option(help="Peak bandwidth in B/s (overrides "
                                                  "--gpu's).")] = None,
    peak_flops: Annotated[float | None, typer.Option(help="Peak FLOP/s (overrides "
                                                     "--gpu's).")] = None,
    output: Annotated[Path | None, typer.Option(
        help="The JSON file (cbbench schema forward), or - for stdout. Default: "
        "results/forward-<time>.json.", parser=output_file, metavar="<path>")] = None,
) -> None:
    """Time the bundled engine's forward step at exact shapes, against its roofline floor.

    Decode batches at --context and prefill chunks of --prefill-tokens, one full engine step
    each (packing, forward, logits, sampling, the host sync), with CUDA graphs and without;
    each row with the roofline floor, MBU, MFU and the per-operator table. On a CPU it runs
    the small presets and says it is a CPU (mbu/mfu null: no GPU peak applies).
    """
    import torch

    from cbbench.analysis.result import check_writable, dumps, is_stdout, write_atomic
    from cbbench.bench.forward import CPU_PRESETS, ForwardSpec, run_forward
    from cbbench.bench.runner import recorded_command
    from cbbench.schema import ForwardResult, file_text, from_built

    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    spec = ForwardSpec(
        model=model or (CPU_PRESETS[0] if on_cpu else DEFAULT_MODEL_GPU), device=device,
        dtype=dtype, batch_sizes=_ints(batch_sizes, "--batch-sizes"), context=context,
        prefill_tokens=_ints(prefill_tokens, "--prefill-tokens"), steps=steps, warmup=warmup,
        cuda_graphs=cuda_graphs, gpu=gpu, peak_bw=peak_bw, peak_flops=peak_flops,
    )
    spec.check()
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_path = output or Path("results") / f"forward-{stamp}.json"
    check_writable(out_path)
    to_stdout = is_stdout(out_path)
    say = (lambda m: typer.echo(m, err=True)) if to_stdout else typer.echo
    measured = run_forward(spec, log=say)
    measured["command"] = recorded_command(sys.argv[1:])
    try:  # the file's model, built once: the table reads it, the file is its dump
        result = from_built(ForwardResult, measured, "the forward result")
    except UsageError:  # a field the schema refuses: the measurements are kept as measured
        write_atomic(out_path, dumps(measured) + "\n")
        raise
    say("")
    say(forward_table(result))
    write_atomic(out_path, file_text(result))
    if not to_stdout:
        typer.echo(f"\nforward: {out_path}")
    if result.interrupted:  # the rows measured are kept; the exit is an interrupt's (130)
        raise KeyboardInterrupt
    if result.errors:
        raise UsageError(f"{len(result.errors)} shape(s) failed (their errors are in the "
                         f"file): first {result.errors[0].error}")


def forward_table(result: ForwardResult) -> str:
    from tabulate import tabulate

    dev = result.device
    head = (f"cbbench forward · {result.model} {result.dtype} · "
            f"{'a CPU (' + dev.name + ')' if dev.is_cpu else dev.name} · "
            f"{result.attention_backend} attention · peaks: {result.peaks.source}")

    def pct(v):
        return "-" if v is None else f"{v:.1%}"

    def step(s):  # hyperfine's mean ± σ
        return f"{s.mean:.3f}" + ("" if s.std is None else f" ± {s.std:.3f}")

    rows = [[r.phase, r.batch_size, r.tokens, r.context,
             "on" if r.graphs else "off", step(r.step_ms),
             f"{r.floor_ms:.4g}", pct(r.roofline_fraction), pct(r.mbu), pct(r.mfu),
             f"{r.tokens_per_s:,.0f}"] for r in result.rows]
    table = tabulate(rows, headers=["phase", "batch", "tokens", "context", "graphs", "step ms",
                                    "floor ms", "of floor", "MBU", "MFU", "tok/s"],
                     disable_numparse=True)
    parts = [head, "", table]
    if result.rows:  # the per-operator table of the largest decode and prefill rows
        for phase in ("decode", "prefill"):
            rs = [r for r in result.rows if r.phase == phase]
            if rs:
                big = max(rs, key=lambda r: r.tokens)
                ops = [[o.name, f"{o.flops / 1e9:,.3f}", f"{o.bytes / 1e6:,.3f}",
                        f"{o.floor_ms:.4g}", o.bound] for o in big.operators]
                parts += ["", f"{phase} batch {big.batch_size}, {big.tokens} tokens: "
                          "floor by operator",
                          tabulate(ops, headers=["operator", "GFLOP", "MB", "floor ms", "bound"],
                                   disable_numparse=True)]
    parts += [f"note: {n}" for n in result.notes]
    return "\n".join(parts)
