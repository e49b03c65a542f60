"""Pieces shared by the CLI commands: messages, exit codes, and the engine options that `run`,
`serve`, `compare`, `sweep` and `capacity` all take (one definition, so the names cannot drift)."""

from __future__ import annotations

import datetime as _dt
import functools
import inspect
import math
from pathlib import Path
from typing import Annotated

import typer

from cbbench.errors import UsageError
from cbbench.targets.engine import (
    DEFAULT_SWAP_SPACE_GIB,
    PREEMPTION_MODES,
    QUEUE_POLICIES,
    EngineOptions,
)

USAGE_EXIT = 2


def notice(msg: str) -> None:
    typer.echo(f"cbbench: {msg}", err=True)


def guard(fn):
    """Turn a UsageError into one line on stderr and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as e:
            typer.echo(f"cbbench: error: {e}", err=True)
            raise typer.Exit(USAGE_EXIT) from None

    return wrapper


def default_output_path(kind: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"run-{stamp}-{kind}.json"


def parse_rate_option(text: str) -> float:
    from cbbench.load.arrivals import parse_rate

    return parse_rate(text)


# ---- engine options, shared by every command that builds the bundled engine ------------------
Engine = Annotated[
    str,
    typer.Option(help="auto | torch | sim. auto: torch on CUDA if present, else torch on the CPU."),
]
Model = Annotated[
    str | None,
    typer.Option(
        help="Model preset (llama-3-8b, llama-3.2-1b, qwen2.5-7b, ...) or a Hugging Face folder. "
        "Default: llama-3-8b (sim, CUDA), 'small' (CPU)."
    ),
]
Gpu = Annotated[
    str | None, typer.Option(help="Simulated GPU: a100-80gb, h100, h200, ... Default: h200.")
]
SchedulerOpt = Annotated[
    str, typer.Option("--scheduler", help="continuous (iteration-level) | static (batch at a time).")
]
Chunked = Annotated[
    bool,
    typer.Option(
        "--chunked-prefill/--no-chunked-prefill",
        help="Split long prompts across iterations so decodes keep moving.",
    ),
]
KvAllocation = Annotated[
    str,
    typer.Option(help="paged (grow block by block) | reserved (prompt + max output at admission)."),
]
MaxBatched = Annotated[
    int | None,
    typer.Option(
        help="Token budget per iteration. Default as vLLM: 2048 with chunked prefill, else "
        "max(max_model_len, 2048)."
    ),
]
MaxSeqs = Annotated[int, typer.Option(help="Most requests running at once (vLLM's default: 256).")]
BlockSize = Annotated[int, typer.Option(help="Tokens per KV block.")]
NumKvBlocks = Annotated[
    int | None, typer.Option(help="KV pool size in blocks. Default: derived from memory.")
]
MaxModelLen = Annotated[int | None, typer.Option(help="Context length. Default: the model's.")]
GpuMemUtil = Annotated[
    float, typer.Option(help="Fraction of GPU memory for weights + KV cache (vLLM's default 0.9).")
]
Preemption = Annotated[
    str,
    typer.Option(
        help="When KV runs out: recompute (free the victim's KV; it recomputes on resume) | "
        "swap (copy its KV to CPU memory and back; recompute when the swap space is full)."
    ),
]
SwapSpace = Annotated[
    float,
    typer.Option(help="CPU swap space in GiB for --preemption swap (vLLM's default 4)."),
]
Policy = Annotated[
    str,
    typer.Option(
        help="fcfs | priority: admit by each request's priority (lower first, ties by arrival); "
        "a request short of KV preempts a lower-priority running one."
    ),
]
PrefixCaching = Annotated[
    bool,
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="Reuse the KV of full blocks shared with earlier requests (needs token ids: "
        "workloads with prompt_token_ids, or the torch engine).",
    ),
]
Device = Annotated[str | None, typer.Option(help="torch engine: cpu | cuda. Default: cuda if present.")]
Dtype = Annotated[
    str | None, typer.Option(help="bf16 | fp16 | fp32. Default: bf16 on CUDA, fp32 on the CPU.")
]
AttnBackend = Annotated[
    str, typer.Option(help="auto | reference | torch | triton | flash-attn (torch engine).")
]
Temperature = Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")]
TopP = Annotated[float, typer.Option(help="Nucleus sampling threshold.")]
TopK = Annotated[int, typer.Option(help="Top-k sampling; 0 = off.")]
IgnoreEos = Annotated[
    bool,
    typer.Option(
        "--ignore-eos/--no-ignore-eos",
        help="Benchmark runs ignore EOS so output lengths follow the workload.",
    ),
]
CudaGraphs = Annotated[
    bool, typer.Option("--cuda-graphs/--no-cuda-graphs", help="Replay CUDA graphs for decode.")
]
EtaMemory = Annotated[
    float | None, typer.Option(help="sim: fraction of peak HBM bandwidth reached (default 0.80).")
]
EtaCompute = Annotated[
    float | None, typer.Option(help="sim: fraction of peak FLOP/s reached (default 0.60).")
]
Overhead = Annotated[
    float | None, typer.Option(help="sim: fixed overhead per iteration in µs (default 300).")
]


# Every command that builds the bundled engine takes these options, in this order, with these
# defaults: (name, annotation, default). `with_engine_options` adds them to a command.
ENGINE_OPTIONS = (
    ("engine", Engine, "auto"),
    ("model", Model, None),
    ("gpu", Gpu, None),
    ("scheduler", SchedulerOpt, "continuous"),
    ("chunked_prefill", Chunked, True),
    ("kv_allocation", KvAllocation, "paged"),
    ("max_num_batched_tokens", MaxBatched, None),
    ("max_num_seqs", MaxSeqs, 256),
    ("block_size", BlockSize, 16),
    ("num_kv_blocks", NumKvBlocks, None),
    ("max_model_len", MaxModelLen, None),
    ("gpu_memory_utilization", GpuMemUtil, 0.9),
    ("preemption", Preemption, "recompute"),
    ("swap_space", SwapSpace, DEFAULT_SWAP_SPACE_GIB),
    ("policy", Policy, "fcfs"),
    ("enable_prefix_caching", PrefixCaching, False),
    ("device", Device, None),
    ("dtype", Dtype, None),
    ("attention_backend", AttnBackend, "auto"),
    ("temperature", Temperature, 0.0),
    ("top_p", TopP, 1.0),
    ("top_k", TopK, 0),
    ("ignore_eos", IgnoreEos, True),
    ("cuda_graphs", CudaGraphs, True),
    ("eta_memory", EtaMemory, None),
    ("eta_compute", EtaCompute, None),
    ("iteration_overhead_us", Overhead, None),
)


def with_engine_options(fn):
    """Give a command the shared engine options: Typer sees them in its signature (after the
    command's own), and the command receives them checked and bundled as ``engine_opts``, built
    with the command's own ``--seed``. One list, so run, serve, compare, sweep and capacity
    cannot drift apart."""
    hints = inspect.signature(fn, eval_str=True).parameters
    own = [p for name, p in hints.items() if name != "engine_opts"]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
        for name, ann, default in ENGINE_OPTIONS
    ]

    @functools.wraps(fn)
    def wrapper(**kwargs):
        values = {name: kwargs.pop(name) for name, _, _ in ENGINE_OPTIONS}
        kwargs["engine_opts"] = engine_options(**values, seed=kwargs["seed"])
        return fn(**kwargs)

    params = own + extra
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def engine_options(
    engine: str,
    model: str | None,
    gpu: str | None,
    scheduler: str,
    chunked_prefill: bool,
    kv_allocation: str,
    max_num_batched_tokens: int | None,
    max_num_seqs: int,
    block_size: int,
    num_kv_blocks: int | None,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    device: str | None,
    dtype: str | None,
    attention_backend: str,
    temperature: float,
    top_p: float,
    top_k: int,
    ignore_eos: bool,
    cuda_graphs: bool,
    eta_memory: float | None,
    eta_compute: float | None,
    iteration_overhead_us: float | None,
    seed: int,
    preemption: str = "recompute",
    swap_space: float = DEFAULT_SWAP_SPACE_GIB,
    policy: str = "fcfs",
    enable_prefix_caching: bool = False,
) -> EngineOptions:
    for name, value, low in (
        ("--max-num-seqs", max_num_seqs, 1),
        ("--block-size", block_size, 1),
        ("--max-num-batched-tokens", max_num_batched_tokens, 1),
        ("--num-kv-blocks", num_kv_blocks, 1),
        ("--max-model-len", max_model_len, 1),
        ("--top-k", top_k, 0),
    ):
        if value is not None and value < low:
            raise UsageError(f"{name} must be >= {low}, got {value}")
    if seed < 0:
        raise UsageError(f"--seed must be >= 0, got {seed}")
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError("--gpu-memory-utilization must be in (0, 1]")
    if temperature < 0 or not math.isfinite(temperature):
        raise UsageError("--temperature must be >= 0")
    if not 0 < top_p <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    if scheduler not in ("continuous", "static"):
        raise UsageError(f"unknown scheduler {scheduler!r}: use continuous, static")
    if kv_allocation not in ("paged", "reserved"):
        raise UsageError(f"unknown KV allocation {kv_allocation!r}: use paged, reserved")
    if dtype is not None and dtype not in ("bf16", "fp16", "fp32"):
        raise UsageError(f"unknown dtype {dtype!r}: use bf16, fp16, fp32")
    if device is not None and device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}: use cpu, cuda")
    if preemption not in PREEMPTION_MODES:
        raise UsageError(
            f"unknown preemption mode {preemption!r}: use {', '.join(PREEMPTION_MODES)}"
        )
    if not swap_space >= 0 or not math.isfinite(swap_space):
        raise UsageError(f"--swap-space must be a number of GiB >= 0, got {swap_space}")
    if policy not in QUEUE_POLICIES:
        raise UsageError(f"unknown policy {policy!r}: use {', '.join(QUEUE_POLICIES)}")
    return EngineOptions(
        engine=engine,
        model=model,
        gpu=gpu,
        scheduler=scheduler,
        chunked_prefill=chunked_prefill,
        kv_allocation=kv_allocation,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        device=device,
        dtype=dtype,
        attention_backend=attention_backend,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        ignore_eos=ignore_eos,
        cuda_graphs=cuda_graphs,
        eta_memory=eta_memory,
        eta_compute=eta_compute,
        iteration_overhead_us=iteration_overhead_us,
        seed=seed,
        preemption=preemption,
        swap_space=swap_space,
        policy=policy,
        enable_prefix_caching=enable_prefix_caching,
    )


# ---- endpoint options, shared by run, sweep and capacity ------------------------------------
Endpoint = Annotated[
    str | None,
    typer.Option(help="Benchmark this OpenAI-compatible endpoint instead of the bundled engine."),
]
Api = Annotated[str, typer.Option(help="Endpoint API: completions | chat.")]
ServedModel = Annotated[
    str | None, typer.Option(help="Model name to request. Default: the first of /v1/models.")
]
IgnoreEosField = Annotated[
    bool,
    typer.Option(
        "--ignore-eos-field/--no-ignore-eos-field",
        help="Send ignore_eos (vLLM, SGLang); turn off for servers that reject unknown fields.",
    ),
]
Header = Annotated[
    list[str] | None,
    typer.Option(help="HTTP header KEY=VALUE (repeatable); VALUE $NAME or env:NAME reads the "
                 "environment. Values are never written to the results."),
]
RequestTimeout = Annotated[float, typer.Option(help="Seconds allowed per request (endpoint).")]
Tokenizer = Annotated[
    str | None,
    typer.Option(help="tokenizer.json: exact synthetic prompt lengths and token counts (endpoint)."),
]


def endpoint_options(
    endpoint, api, served_model, ignore_eos_field, header, request_timeout, tokenizer, seed,
    max_concurrency=None, scrape_metrics=False,
):
    """EndpointOptions for --endpoint (None without it), checked before any probe runs."""
    if endpoint is None:
        return None
    from cbbench.targets.http import EndpointOptions, parse_header

    opts = EndpointOptions(
        endpoint=endpoint,
        api=api,
        served_model=served_model,
        ignore_eos_field=ignore_eos_field,
        headers=dict(parse_header(h) for h in header or []),
        request_timeout_s=request_timeout,
        tokenizer=tokenizer,
        seed=seed,
        max_concurrency=max_concurrency,
        scrape_metrics=scrape_metrics,
    )
    opts.validate()
    return opts
