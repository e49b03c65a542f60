"""`cbbench forward`: the bundled torch engine's step time at exact shapes, beside its roofline
floor (vLLM's ``vllm bench forward``, for this engine).

A random-weight model is built once with a KV cache filled with random values (tensor cores
run measurably faster on zeros, so a zero cache would flatter the kernels). For each decode
batch size (every row attending ``context + 1`` keys) and each prefill chunk (``tokens`` new
tokens after none cached), one ``ModelRunner.execute`` is timed as the engine sees an
iteration: host-side packing, forward, logits, sampling and the one host sync; the same step
is replayed every time (the requests are not advanced), so the shape stays exact. Decode rows
run with CUDA graphs and without (on a GPU; a CPU has none). Each row carries:

- ``step_ms`` (mean, ``std`` (the sample standard deviation), p50, min, max over ``steps``
  timed steps after ``warmup`` untimed ones), and a note when hyperfine's outlier rule says
  the figure is not to be trusted (:func:`timing_warning`);
- the roofline floor (cbbench/bench/roofline.py) and its per-operator table;
- ``mbu`` = bytes / step time / peak bandwidth, ``mfu`` = FLOPs / step time / peak FLOP/s,
  ``roofline_fraction`` = floor / step time (what tests/gpu's decode check calls its MBU).

The peaks are the GPU's (engine/sim/gpu_specs.py, matched from the device name), or
``peak_bw`` / ``peak_flops`` as given. On a CPU the floor is that of the named ``gpu`` (what
the shape would take there) and ``mbu``/``mfu`` are null unless peaks are given: a CPU's time
over a GPU's peak is no utilization of anything. A CPU runs the small presets only.

Timing uses ``torch.cuda.Event`` on CUDA (UNTESTED here: no GPU in the session that wrote it),
``time.perf_counter`` on a CPU.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from cbbench.bench.roofline import (
    decode_rows,
    operator_table,
    prefill_rows,
    step_floor,
    step_operators,
)
from cbbench.errors import UsageError
from cbbench.schema.forward import FORWARD_KIND, FORWARD_SCHEMA_VERSION

CPU_PRESETS = ("tiny", "small")  # a CPU times these; a real model's step would take minutes
DEFAULT_REFERENCE_GPU = "h100"  # a CPU run's floors: what the shape would take on it
KV_FILL_STD = 1.0  # K and V after the model's norms and projections: O(1)
GRAPH_MODES = ("auto", "on", "off", "both")
# hyperfine's outlier threshold (src/outlier_detection.rs): a modified Z-score, (x - median) /
# MAD, past ten standard deviations (1.4826 MAD is one for normal data).
OUTLIER_Z = 1.4826 * 10.0


@dataclass(frozen=True)
class ForwardSpec:
    model: str = "tiny"
    device: str = "cpu"
    dtype: str = "bf16"
    batch_sizes: tuple[int, ...] = (1, 16, 64, 256)
    context: int = 512
    prefill_tokens: tuple[int, ...] = (2048,)
    steps: int = 20
    warmup: int = 3
    cuda_graphs: str = "both"  # on a GPU: decode rows with graphs, without, or both
    block_size: int = 16
    seed: int = 0
    gpu: str | None = None  # the peaks' GPU (default: the device's; a CPU: DEFAULT_REFERENCE_GPU)
    peak_bw: float | None = None
    peak_flops: float | None = None
    attention_backend: str = "auto"

    def check(self) -> None:
        if not self.batch_sizes and not self.prefill_tokens:
            raise UsageError("give --batch-sizes or --prefill-tokens: nothing to time")
        for name, values in (("--batch-sizes", self.batch_sizes),
                             ("--prefill-tokens", self.prefill_tokens)):
            if any(v < 1 for v in values):
                raise UsageError(f"{name} must be positive integers, got {list(values)}")
        if self.context < 0:
            raise UsageError(f"--context must be >= 0, got {self.context}")
        if self.steps < 1 or self.warmup < 0:
            raise UsageError("--steps must be >= 1 and --warmup >= 0")
        if self.cuda_graphs not in GRAPH_MODES:
            raise UsageError(f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}")
        for name, v in (("--peak-bw", self.peak_bw), ("--peak-flops", self.peak_flops)):
            if v is not None and not v > 0:
                raise UsageError(f"{name} must be positive, got {v}")


@dataclass
class Peaks:
    bandwidth: float
    flops: float
    source: str  # where they came from, in words
    utilization: bool  # mbu/mfu are meaningful: the peaks are this device's


def _peaks(spec: ForwardSpec, device, torch) -> tuple[Peaks, dict | None]:
    from cbbench.engine.sim.gpu_specs import get_gpu_spec, match_device_name

    gpu = None
    if spec.gpu is not None:
        try:
            gpu = get_gpu_spec(spec.gpu)
        except ValueError as e:
            raise UsageError(str(e)) from None
    elif device.type == "cuda":
        gpu = match_device_name(torch.cuda.get_device_name(device))
    on_gpu = device.type == "cuda"
    given = spec.peak_bw is not None and spec.peak_flops is not None
    if gpu is None and not given:
        if on_gpu:
            raise UsageError(f"unknown GPU {torch.cuda.get_device_name(device)!r}: give --gpu "
                             "or --peak-bw and --peak-flops")
        gpu = get_gpu_spec(DEFAULT_REFERENCE_GPU)
    bw = spec.peak_bw if spec.peak_bw is not None else _spec_peak(gpu, "hbm_bandwidth")
    fl = spec.peak_flops if spec.peak_flops is not None else _spec_flops(gpu, spec.dtype)
    source = "given" if given else _source(spec, gpu.name if gpu else "?", on_gpu)
    return Peaks(bw, fl, source, on_gpu or given), (gpu.to_dict() if gpu else None)


def _source(spec: ForwardSpec, name: str, on_gpu: bool) -> str:
    """Where the peaks came from, each said apart when one was given: --peak-bw alone was
    labelled "h100 spec" though the bandwidth was the user's."""
    spec_text = f"{name} spec" + ("" if on_gpu else " (a CPU: reference)")
    if spec.peak_bw is not None:
        return f"bandwidth given, FLOP/s {spec_text}"
    if spec.peak_flops is not None:
        return f"FLOP/s given, bandwidth {spec_text}"
    return spec_text


def _spec_peak(gpu, attr: str) -> float:
    if gpu is None:  # _peaks chose a GPU whenever a peak was not given
        raise UsageError("give --gpu, or both --peak-bw and --peak-flops")
    return float(getattr(gpu, attr))


def _spec_flops(gpu, dtype: str) -> float:
    """The spec's dense FLOP peak for ``dtype`` (fp32: the FP32 peak, gpu_specs.FP32_FLOPS)."""
    if gpu is None:
        raise UsageError("give --gpu, or both --peak-bw and --peak-flops")
    peak = gpu.peak_flops(dtype)
    if peak is None:
        raise UsageError(f"{gpu.name} has no {dtype} FLOP peak listed: give --peak-flops")
    return float(peak)


class StepTimer:
    """CUDA events on a GPU, perf_counter on a CPU; ``elapsed_ms`` syncs (also the GPU
    check's timer, tests/gpu/gpu_check_decode.py)."""

    def __init__(self, device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            import torch

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
            return float(self.start.elapsed_time(self.end))
        return (self.t1 - self.t0) * 1000.0


def fill_random_(kv_caches, seed: int) -> None:
    """Random K/V, written once before anything is timed (block 0 too: padding rows read it)."""
    import torch

    for i, (k, v) in enumerate(kv_caches):
        g = torch.Generator(device=k.device).manual_seed(seed + i)
        for t in (k, v):
            t.normal_(0.0, KV_FILL_STD, generator=g)


def step_requests(rows, vocab: int, bm, seed: int, decode: bool):
    """Requests in the state one step of ``rows`` finds them: ``decode``, each row ``(1, C)``
    has C prompt tokens cached and one output token known; else each ``(T, C)`` is a prefill
    chunk of T prompt tokens after C cached. Their KV blocks are allocated for C + T tokens."""
    import numpy as np

    from cbbench.engine.core.request import Request, RequestStatus

    rng = np.random.default_rng(seed)
    reqs = []
    for i, (new, context) in enumerate(rows):
        prompt = context if decode else context + new
        ids = rng.integers(0, vocab, prompt).tolist()
        req = Request(i, prompt, 1 << 20, prompt_token_ids=ids)
        if decode:
            req.output_token_ids.append(int(rng.integers(0, vocab)))
            req.num_output_tokens = 1
        req.num_computed_tokens = context
        req.status = RequestStatus.RUNNING
        if not bm.allocate(req, context + new):
            raise RuntimeError(f"KV pool too small for {len(rows)} rows of {context + new} tokens")
        reqs.append(req)
    return reqs


@dataclass(frozen=True)
class StepStats:
    """A shape's step times (ms) over its timed steps: a row's ``step_ms``."""

    mean: float
    std: float | None  # the sample standard deviation; None for one step (no spread to tell)
    p50: float
    min: float
    max: float


def _stats(xs: list[float]) -> StepStats:
    xs = sorted(xs)
    return StepStats(mean=statistics.fmean(xs), std=statistics.stdev(xs) if len(xs) > 1 else None,
                     p50=statistics.median(xs), min=xs[0], max=xs[-1])


def timing_warning(xs: list[float]) -> str | None:
    """hyperfine's warning over timed steps in the order they ran (src/benchmark/mod.rs): the
    first step an outlier above the rest (the warmup did not reach steady state), else any
    outlier (a noisy machine: the mean is not the step's time); None when quiet."""
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs) or sys.float_info.epsilon
    z = [(x - med) / mad for x in xs]
    if z[0] > OUTLIER_Z:
        return (f"the first timed step ({xs[0]:.3f} ms) was much slower than the rest "
                f"(median {med:.3f} ms): give more --warmup steps")
    n = sum(abs(s) > OUTLIER_Z for s in z)
    if n:
        return (f"statistical outliers, {n} of {len(xs)} timed steps (min {min(xs):.3f}, "
                f"median {med:.3f}, max {max(xs):.3f} ms): rerun on a quiet machine")
    return None


@dataclass
class _Setup:
    model: Any
    config: Any
    kv_caches: list
    bm: Any
    dtype_name: str
    peaks: Peaks
    num_blocks: int
    errors: list = field(default_factory=list)


def _device(name: str, torch):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"--device {name!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: no CUDA device here (use --device cpu)")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {name}: use cpu, cuda or cuda:N")
    return device


def run_forward(spec: ForwardSpec, log=print) -> dict:
    """Time every shape of ``spec``; the result dict (schema/forward.py's ForwardResult)."""
    import torch

    from cbbench.engine.core.block_manager import BlockManager
    from cbbench.engine.model_config import get_model_config
    from cbbench.engine.torch.models.llama import allocate_kv_cache
    from cbbench.engine.torch.models.loader import load_model, resolve_dtype
    from cbbench.kernels import get_backend

    spec.check()
    device = _device(spec.device, torch)
    if device.type == "cpu" and spec.model not in CPU_PRESETS:
        raise UsageError(f"--model {spec.model}: a CPU runs the small presets "
                         f"({', '.join(CPU_PRESETS)}); time a real model on a GPU")
    try:
        config = get_model_config(spec.model)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise UsageError(f"--model {spec.model}: {e}") from None
    if config.is_moe:
        raise UsageError(f"--model {spec.model}: a mixture of experts' step bytes depend on "
                         "its routing; cbbench forward times dense models")
    try:
        dtype = resolve_dtype(spec.dtype)
    except ValueError as e:
        raise UsageError(f"--dtype: {e}") from None
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    if device.type == "cpu":
        torch.set_num_threads(1)  # as the engine does on a CPU (engine/build.py)
    peaks, gpu_spec = _peaks(spec, device, torch)
    # A decode row holds --context cached tokens and its new one; a prefill row is a chunk with
    # nothing cached (prefill_rows(p): context 0), so it holds its own p tokens only.
    need = [(f"--context {spec.context} (a decode row attends context + 1)", spec.context + 1)
            if spec.batch_sizes else None,
            (f"--prefill-tokens {max(spec.prefill_tokens)}", max(spec.prefill_tokens))
            if spec.prefill_tokens else None]
    for what, positions in (n for n in need if n is not None):
        if positions > config.max_model_len:
            raise UsageError(f"{what} needs {positions} positions; {spec.model} has "
                             f"{config.max_model_len}")
    backend = get_backend(spec.attention_backend, device, block_size=spec.block_size)
    model, config = load_model(spec.model, dtype, device, backend, seed=spec.seed)
    per_decode = -(-(spec.context + 1) // spec.block_size)
    per_prefill = max((-(-p // spec.block_size) for p in spec.prefill_tokens), default=0)
    num_blocks = max(max(spec.batch_sizes, default=0) * per_decode, per_prefill) + 1
    kv_caches = allocate_kv_cache(config, num_blocks, spec.block_size, dtype, device)
    fill_random_(kv_caches, spec.seed)
    setup = _Setup(model, config, kv_caches, BlockManager(num_blocks, spec.block_size),
                   dtype_name, peaks, num_blocks)
    out: dict[str, Any] = {
        "kind": FORWARD_KIND,
        "schema_version": FORWARD_SCHEMA_VERSION,
        "started_at": _now(),
        "device": _device_info(device, torch),
        "model": spec.model,
        "dtype": dtype_name,
        "attention_backend": backend.name,
        "spec": {**asdict(spec), "batch_sizes": list(spec.batch_sizes),
                 "prefill_tokens": list(spec.prefill_tokens)},
        "model_config": config.to_dict(),
        "weight_bytes": config.weight_bytes(dtype_name),
        "kv_bytes_per_token": config.kv_bytes_per_token(dtype_name),
        "peaks": {"hbm_bandwidth": peaks.bandwidth, "flops": peaks.flops,
                  "source": peaks.source, "utilization": peaks.utilization},
        "gpu_spec": gpu_spec,
        "rows": [],
        "errors": setup.errors,
        "notes": [],
    }
    graph_modes = _graph_modes(spec, device, backend.name, out["notes"])
    try:
        _time_rows(spec, setup, device, dtype, graph_modes, out, log, torch)
    except KeyboardInterrupt:  # Ctrl-C: the rows measured so far are kept, marked so
        out["interrupted"] = True
    return out


def _time_rows(spec, setup: _Setup, device, dtype, graph_modes, out: dict, log, torch) -> None:
    for graphs in graph_modes:
        runner = _runner(spec, setup, device, dtype, graphs, out)
        if runner is None:
            continue
        for bs in sorted(spec.batch_sizes):
            _time_row(spec, setup, runner, "decode", decode_rows(bs, spec.context), graphs, out,
                      log)
        del runner
        _empty_cache(device, torch)
    if spec.prefill_tokens:  # prefill chunks run eagerly in the engine (graphs are decode's)
        runner = _runner(spec, setup, device, dtype, False, out)
        if runner is not None:
            for p in sorted(spec.prefill_tokens):
                _time_row(spec, setup, runner, "prefill", prefill_rows(p), False, out, log)


def _now() -> str:
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _device_info(device, torch) -> dict:
    info = {"type": device.type, "is_cpu": device.type == "cpu", "name": platform.processor()
            or platform.machine(), "torch": torch.__version__}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
        info["capability"] = list(torch.cuda.get_device_capability(device))
    return info


def _graph_modes(spec: ForwardSpec, device, backend: str, notes: list) -> list[bool]:
    if device.type != "cuda":
        if spec.cuda_graphs == "on":
            raise UsageError("--cuda-graphs on needs a CUDA device")
        notes.append("a CPU: no CUDA graphs, every row eager")
        return [False]
    if backend != "triton" and spec.cuda_graphs != "off":
        notes.append(f"the {backend} attention backend is not captured in CUDA graphs: eager")
        return [False]
    return {"on": [True], "off": [False], "both": [False, True], "auto": [True]}[spec.cuda_graphs]


def _runner(spec, setup: _Setup, device, dtype, graphs: bool, out: dict):
    from cbbench.engine.torch.model_runner import ModelRunner

    max_bs = max(spec.batch_sizes, default=1)
    t0 = time.perf_counter()
    try:
        runner = ModelRunner(setup.model, setup.config, setup.kv_caches, spec.block_size, device,
                             dtype, use_cuda_graphs=graphs, max_num_seqs=max(max_bs, 1))
        runner.warmup()
    except Exception as e:  # noqa: BLE001 - one configuration failing keeps the others
        setup.errors.append({"stage": "runner", "graphs": graphs, "error": repr(e)})
        return None
    if graphs:
        out.setdefault("graph_capture_s", time.perf_counter() - t0)
        if not runner.cuda_graphs_effective:
            out["notes"].append(f"CUDA graph capture failed, decode ran eagerly: "
                                f"{runner.graphs_fallback_reason}")
    return runner


def _time_row(spec, setup: _Setup, runner, phase: str, rows, graphs: bool, out: dict,
              log) -> None:
    from cbbench.engine.core.scheduler_output import SchedulerOutput

    reqs = step_requests(rows, setup.config.vocab_size, setup.bm, seed=len(rows),
                         decode=phase == "decode")
    tokens = sum(t for t, _ in rows)
    try:
        decodes = len(rows) if phase == "decode" else 0
        sched = SchedulerOutput(reqs, [t for t, _ in rows], decodes, tokens - decodes, tokens)
        for _ in range(spec.warmup):
            runner.execute(sched)
        step_ms = []
        for _ in range(spec.steps):
            with StepTimer(runner.device) as t:
                runner.execute(sched)  # ends with the sampled tokens' host copy: a sync
            step_ms.append(t.elapsed_ms())
    except Exception as e:  # noqa: BLE001 - one shape failing keeps the others
        setup.errors.append({"stage": phase, "graphs": graphs, "rows": len(rows),
                             "tokens": tokens, "error": repr(e)})
        return
    finally:
        for r in reqs:
            setup.bm.free(r)
    p = setup.peaks
    ops = step_operators(setup.config, setup.dtype_name, rows)
    floor = step_floor(ops, p.bandwidth, p.flops)
    step = _stats(step_ms)
    warning = timing_warning(step_ms)
    if warning:
        out["notes"].append(f"{phase} batch {len(rows)}, {tokens} tokens, graphs "
                            f"{'on' if graphs else 'off'}: {warning}")
    seconds = step.mean / 1000.0
    row = {
        "phase": phase,
        "batch_size": len(rows),
        "tokens": tokens,
        "context": rows[0][1],
        "graphs": graphs,
        "graph_replayed": bool(graphs and runner.cuda_graphs_effective
                               and runner.graphs.padded_size(len(rows)) is not None),
        "step_ms": asdict(step),
        "tokens_per_s": tokens / seconds,
        "bytes": floor.bytes,
        "flops": floor.flops,
        "floor_ms": floor.floor_ms,
        "floor_bytes_ms": floor.bytes_ms,
        "floor_flops_ms": floor.flops_ms,
        "roofline_fraction": floor.floor_ms / step.mean,
        "mbu": floor.bytes / seconds / p.bandwidth if p.utilization else None,
        "mfu": floor.flops / seconds / p.flops if p.utilization else None,
        "operators": operator_table(ops, p.bandwidth, p.flops),
    }
    out["rows"].append(row)
    log(f"{phase:7s} batch {len(rows):4d} tokens {tokens:5d} graphs {graphs!s:5}: "
        f"step {step.mean:.4g} ms, floor {floor.floor_ms:.4g} ms")


def _empty_cache(device, torch) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
