"""``bench_gpu.py decode``: decode step time, floor and MBU of one random-weight model.

The model (default llama-3-8b, bf16) is built once; each configuration switches its kernels in
place (``set_layer_ops``, ``set_attention_backend``: same weights) and gets a ModelRunner of its
own, so CUDA graphs are captured for the kernels that run. Configurations: the fused layer
kernels and the unfused ones side by side (``--fused both``), each at every batch size with
and without CUDA graphs, plus eager rows of the ``torch`` attention backend. For every row:

- ``step_ms``: one full ``ModelRunner.execute`` (host-side batch packing, forward, logits,
  sampling and the one host sync), as the engine sees an iteration;
- ``forward_ms``: the forward + logits of an already packed batch, back to back (GPU time);
- ``floor_ms``: the roofline floor, the sum over the step's operators (layer GEMMs, norms,
  LM head, attention, embedding rows) of max(bytes / peak bandwidth, FLOPs / peak FLOP/s),
  with both terms beside it (``floor_bytes_ms``, ``floor_flops_ms``). The bytes: every weight
  except the input embedding table (decode reads only the batch's rows of it: Llama-3-8B bf16
  reads 15.01 of its 16.06 GB, 3.13 ms at batch 1 on an H200's 4.8 TB/s), the batch's
  embedding rows, and batch x (context + 1) x KV bytes per token. At batch 1 every operator is
  bandwidth-bound (floor = bytes term); at batch 256 the GEMMs (~3.6 TFLOP) are compute-bound:
  7.47 ms on an H200, not the 6.71 ms of bytes alone;
- ``mbu``: floor_ms / step time (``mbu_forward`` from forward_ms): the fraction of the
  roofline reached.

Timing uses ``torch.cuda.Event`` on CUDA (``time.perf_counter`` on a CPU), ``--steps`` steps after
``--warmup`` untimed ones. The same decode step is replayed each time (the request is not
advanced), so the context stays exactly ``--context + 1`` keys. The KV cache is filled with
random values once, before anything is timed (a matmul on zeros runs faster than on real data);
the token ids are random too.
"""

from __future__ import annotations

import platform
import statistics
import time
import traceback
from dataclasses import dataclass

# The engine step timer and the K/V fill `cbbench forward` uses (one of each).
from cbbench.bench.forward import KV_FILL_STD, StepTimer, fill_random_
from cbbench.bench.roofline import (
    DTYPE_BYTES,
    Floor,
    Operator,
    decode_rows,
    step_floor,
    step_operators,
)

H200_PEAK_BW = 4.8e12
H200_PEAK_FLOPS = 989e12  # dense bf16 tensor FLOP/s (engine/gpu_specs.py)


# ---- the decode floor -----------------------------------------------------------------------
def decode_weight_bytes(config, dtype: str) -> int:
    """Weight bytes one decode step reads, without the batch's embedding rows: every parameter
    except the input embedding table (an untied table is gathered at the batch's rows only; a
    tied one is the LM head, read whole)."""
    table = 0 if config.tie_word_embeddings else config.embedding_params
    return (config.num_params - table) * DTYPE_BYTES[dtype]


def decode_read_bytes(config, dtype: str, batch: int, context: int) -> int:
    """Bytes a decode step of ``batch`` rows, each attending ``context + 1`` keys, must read."""
    return sum(o.bytes for o in decode_operators(config, dtype, batch, context))


def decode_operators(config, dtype: str, batch: int, context: int) -> list[Operator]:
    """Each operator of a decode step of ``batch`` rows, each attending ``context + 1`` keys
    (the library's roofline, cbbench/bench/roofline.py, at decode rows)."""
    return step_operators(config, dtype, decode_rows(batch, context))


def decode_flops(config, dtype: str, batch: int, context: int) -> float:
    return sum(o.flops for o in decode_operators(config, dtype, batch, context))


def decode_floor(config, dtype: str, batch: int, context: int, peak_bw: float,
                 peak_flops: float) -> Floor:  # fmt: skip
    """The roofline floor of one decode step and both of its terms, in ms (``Floor``): at batch
    1 every operator is bandwidth-bound and the floor is ``bytes_ms``; at batch 256 the GEMMs
    are compute-bound."""
    return step_floor(decode_operators(config, dtype, batch, context), peak_bw, peak_flops)


def decode_floor_ms(config, dtype: str, batch: int, context: int, peak_bw: float,
                    peak_flops: float = H200_PEAK_FLOPS) -> float:  # fmt: skip
    """The roofline floor of a decode step (see ``decode_floor``)."""
    return decode_floor(config, dtype, batch, context, peak_bw, peak_flops).floor_ms


# ---- timing ---------------------------------------------------------------------------------
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


def _decode_requests(n: int, context: int, vocab: int, bm, seed: int):
    """``n`` requests one step into decoding: ``context`` prompt tokens cached, one output token
    known (its KV not yet written): every execute() is a pure-decode row with context + 1 keys."""
    import numpy as np

    from cbbench.engine.core.request import Request, RequestStatus

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


@dataclass
class DecodeSetup:
    """What every configuration shares: the model, its KV cache and block manager, the
    device's peak bandwidth and cost model."""

    model: object
    config: object
    kv_caches: list
    bm: object
    dtype_name: str
    peak_bw: float
    peak_flops: float
    cost_model: object


def run_decode(args) -> dict:
    import torch
    from gpu_check_agree import backends_agree

    from cbbench.engine.sim.gpu_specs import match_device_name
    from cbbench.engine.torch.models.loader import resolve_dtype
    from cbbench.kernels import get_backend, layer_ops

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
    setup = None
    try:
        backend = get_backend(args.attention_backend, device, block_size=args.block_size)
        setup = _setup(args, out, device, dtype, dtype_name, peak_bw, gpu, backend, fused_list[0])
    except Exception as exc:  # noqa: BLE001
        _error(errors, exc, stage="model")
    if setup is not None:
        for fused in fused_list:
            try:
                setup.model.set_layer_ops(layer_ops(fused))
                setup.model.set_attention_backend(backend)
                _decode_config(args, out, device, dtype, setup, fused, args.batch_sizes, "main")
            except Exception as exc:  # noqa: BLE001
                _error(errors, exc, stage="config", fused=fused)
        # The torch attention backend too (issue 12 item 7): eager, unfused, the smaller batches.
        if args.torch_backend_rows:
            torch_bs = [b for b in args.batch_sizes if b <= args.torch_backend_max_batch] or [1]
            try:
                setup.model.set_layer_ops(layer_ops(False))
                setup.model.set_attention_backend(get_backend("torch", device))
                _decode_config(args, out, device, dtype, setup, False, torch_bs, "torch_backend",
                               graphs_variants=[False])  # fmt: skip
            except Exception as exc:  # noqa: BLE001
                _error(errors, exc, stage="torch backend rows")
    if setup is not None:
        try:  # the fused configuration (the engine's default) again: the torch rows switched it
            setup.model.set_layer_ops(layer_ops(fused_list[0]))
            setup.model.set_attention_backend(backend)
            out["kernel_table"] = kernel_table(args, setup, device, dtype)
        except Exception as exc:  # noqa: BLE001
            _error(errors, exc, stage="kernel table")
    if setup is not None and device.type == "cuda" and backend.name == "triton":
        try:
            out["decode_attention_us"] = attention_kernels(args, setup, device, dtype)
        except Exception as exc:  # noqa: BLE001
            _error(errors, exc, stage="decode attention kernels")
    # The same model serves the agreement check when it is the one asked for.
    shared = setup.model if setup is not None and args.agree_model == args.model else None
    if setup is not None and shared is None:
        del setup.model, setup.kv_caches  # free the device before another model is built
        _empty_cache(device)
    try:
        out["backends_agree"] = backends_agree(args, device, dtype, shared)
    except Exception as exc:  # noqa: BLE001
        _error(errors, exc, stage="backends_agree")
    if device.type == "cuda":
        out["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def kernel_table(args, setup: DecodeSetup, device, dtype) -> dict:
    """torch.profiler over a few steps at the smallest and largest batch (gpu_check_profile)."""
    from gpu_check_profile import kernel_profile

    from cbbench.engine.core.scheduler_output import SchedulerOutput
    from cbbench.engine.torch.model_runner import ModelRunner

    def make_runner(graphs: bool):
        runner = ModelRunner(
            setup.model, setup.config, setup.kv_caches, args.block_size, device, dtype,
            use_cuda_graphs=graphs, max_num_seqs=max(max(args.batch_sizes), args.max_num_seqs),
        )  # fmt: skip
        runner.warmup()
        return runner

    def make_sched(bs: int):
        reqs = _decode_requests(bs, args.context, setup.config.vocab_size, setup.bm, seed=bs)

        def release() -> None:
            for r in reqs:
                setup.bm.free(r)

        return SchedulerOutput(reqs, [1] * bs, bs, 0, bs), release

    sizes = sorted({min(args.batch_sizes), max(args.batch_sizes)})
    try:
        return kernel_profile(args, setup, device, sizes, make_runner, make_sched)
    finally:
        _empty_cache(device)


# The chosen path ("split": what the engine runs, splits as a captured graph of that batch size
# gets them) beside the unsplit kernels.
ATTENTION_KERNELS = ("split", "packed", "packed-cores", "unified")
ATTENTION_REPS = 20


def _time_in_graph(fn, device, reps: int) -> tuple[float, str]:
    """µs per call of ``fn``: ``reps`` calls captured in one CUDA graph and replayed, so the
    host's launch overhead (~40 µs per eager call of the Python launcher, which is what the
    H100 run's 45 µs "per layer" at batch 1 measured) drops out; eager if capture fails."""
    import torch

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # compile and warm up off the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        with StepTimer(device) as t:
            graph.replay()
        return t.elapsed_ms() / reps * 1000, "graph"
    except Exception:  # noqa: BLE001 - fall back to eager launches, and say so
        with StepTimer(device) as t:
            for _ in range(reps):
                fn()
        return t.elapsed_ms() / reps * 1000, "eager"


def attention_kernels(args, setup: DecodeSetup, device, dtype) -> dict:
    """One layer's decode attention alone on the model's shapes and the random KV cache:
    {kernel: {batch size: µs}}, timed inside a CUDA graph, plus each one's bandwidth (KV bytes
    read / time) against the peak. "split" is the engine's own choice (split-K where the
    chooser splits, with the split count a captured graph of that batch size has: max_seqlen_k
    = the model's length), the others unsplit. UNTESTED on a GPU so far."""
    import dataclasses

    import torch

    from cbbench.kernels import build_metadata
    from cbbench.kernels.triton_attention import TritonBackend

    cfg, (k_cache, v_cache) = setup.config, setup.kv_caches[0]
    blocks_per_req = -(-(args.context + 1) // args.block_size)
    max_len = args.max_model_len or cfg.max_model_len
    out: dict = {"context": args.context, "us": {}, "bandwidth_fraction": {}, "splits": {},
                 "timing": {}}  # fmt: skip
    for kernel in ATTENTION_KERNELS:
        if kernel == "split":
            backend = TritonBackend()
        else:
            backend = TritonBackend(decode_splits=1, decode_kernel=kernel)
        out["us"][kernel], out["bandwidth_fraction"][kernel] = {}, {}
        for bs in sorted(args.batch_sizes):
            tables = [list(range(i * blocks_per_req, (i + 1) * blocks_per_req)) for i in range(bs)]
            md = build_metadata([1] * bs, [args.context] * bs, tables, args.block_size,
                                device=device)  # fmt: skip
            md = dataclasses.replace(md, max_seqlen_k=max_len)  # as a captured graph has it
            if kernel == "split":
                out["splits"][str(bs)] = backend.choose_decode_splits(md, cfg.num_kv_heads, device)
            q = torch.randn(bs, cfg.num_heads, cfg.head_dim, dtype=dtype, device=device)
            us, how = _time_in_graph(
                lambda b=backend, m=md, q=q: b.forward(q, k_cache, v_cache, m, cfg.head_dim**-0.5),
                device, ATTENTION_REPS,
            )  # fmt: skip
            kv = bs * (args.context + 1) * cfg.kv_bytes_per_token(setup.dtype_name) / cfg.num_layers
            out["us"][kernel][str(bs)] = us
            out["timing"][f"{kernel} {bs}"] = how
            out["bandwidth_fraction"][kernel][str(bs)] = kv / (us * 1e-6) / setup.peak_bw
        print(f"decode attention {kernel}: {out['us'][kernel]} us", flush=True)
    return out


def _empty_cache(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


def _setup(args, out, device, dtype, dtype_name, peak_bw, gpu, backend, fused) -> DecodeSetup:
    """Build the model (once) and a KV cache for the largest batch."""
    import torch

    from cbbench.engine.core.block_manager import BlockManager
    from cbbench.engine.sim.cost_model import CostModel
    from cbbench.engine.torch.models.llama import allocate_kv_cache
    from cbbench.engine.torch.models.loader import load_model

    t0 = time.perf_counter()
    model, config = load_model(
        args.model, dtype, device, backend, seed=0, max_model_len=args.max_model_len, fused=fused
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    out["model_build_s"] = time.perf_counter() - t0
    out["model_config"] = config.to_dict()
    out["weight_bytes"] = config.weight_bytes(dtype_name)
    out["decode_weight_bytes"] = decode_weight_bytes(config, dtype_name)
    out["kv_bytes_per_token"] = config.kv_bytes_per_token(dtype_name)
    out["min_step_ms_weights_only"] = decode_weight_bytes(config, dtype_name) / peak_bw * 1000
    blocks_per_req = -(-(args.context + 1) // args.block_size)
    num_blocks = max(args.batch_sizes) * blocks_per_req + 1
    kv_caches = allocate_kv_cache(config, num_blocks, args.block_size, dtype, device)
    fill_random_(kv_caches, seed=args.seed)
    out["kv_cache_fill"] = f"normal(0, {KV_FILL_STD}), seed {args.seed}, filled once"
    peak_flops = args.peak_flops or (gpu.bf16_flops if gpu else H200_PEAK_FLOPS)
    out["peak_flops"] = peak_flops
    return DecodeSetup(model, config, kv_caches, BlockManager(num_blocks, args.block_size),
                       dtype_name, peak_bw, peak_flops, CostModel(config, dtype_name, gpu))  # fmt: skip


def _decode_config(args, out, device, dtype, setup: DecodeSetup, fused, batch_sizes, role,
                   graphs_variants=None) -> None:  # fmt: skip
    """Time every batch size (with and without graphs) for the model's current kernels; rows
    are tagged with ``role``: "main" (the configured backend) or "torch_backend" (extra rows)."""
    from cbbench.engine.torch.model_runner import ModelRunner

    backend = setup.model.attn_backend
    label = f"{backend.name}{' fused' if fused else ''}"
    out.setdefault("attention_backends", []).append(backend.name)
    max_bs = max(batch_sizes)
    if graphs_variants is None:
        graphs_variants = [False]
        if device.type == "cuda" and not args.no_graphs and backend.name == "triton":
            graphs_variants.append(True)
    for graphs in graphs_variants:
        t0 = time.perf_counter()
        try:
            runner = ModelRunner(
                setup.model, setup.config, setup.kv_caches, args.block_size, device, dtype,
                use_cuda_graphs=graphs, max_num_seqs=max(max_bs, args.max_num_seqs),
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
                row = _time_batch(args, runner, bs, setup)
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
        del runner  # its graphs' memory pool
        _empty_cache(device)

def _time_batch(args, runner, bs, setup: DecodeSetup) -> dict:
    import torch

    from cbbench.engine.core.scheduler_output import SchedulerOutput

    device = runner.device
    bm, config, dtype_name = setup.bm, setup.config, setup.dtype_name
    reqs = _decode_requests(bs, args.context, config.vocab_size, bm, seed=bs)
    try:
        sched = SchedulerOutput(reqs, [1] * bs, bs, 0, bs)
        for _ in range(args.warmup):
            runner.execute(sched)
        step_ms = []
        for _ in range(args.steps):
            with StepTimer(device) as t:
                runner.execute(sched)  # ends with the sampled tokens' host copy: a sync
            step_ms.append(t.elapsed_ms())
        batch = runner.prepare(sched)
        with torch.inference_mode():
            for _ in range(args.warmup):
                runner.compute_logits(batch)
            with StepTimer(device) as t:
                for _ in range(args.steps):
                    runner.compute_logits(batch)
        forward_ms = t.elapsed_ms() / args.steps
    finally:
        for r in reqs:
            bm.free(r)
    roof = decode_floor(config, dtype_name, bs, args.context, setup.peak_bw, setup.peak_flops)
    floor = roof.floor_ms
    step = _stats(step_ms)
    return {
        "batch_size": bs,
        "context": args.context,
        "step_ms": step,
        "forward_ms": forward_ms,
        "tokens_per_s": bs / (step["mean"] / 1000),
        "bytes_read": decode_read_bytes(config, dtype_name, bs, args.context),
        "floor_ms": floor,
        "floor_bytes_ms": roof.bytes_ms,
        "floor_flops_ms": roof.flops_ms,
        "flops": decode_flops(config, dtype_name, bs, args.context),
        # Of the roofline floor (not bytes alone: at batch 256 the GEMMs are compute-bound).
        "mbu": floor / step["mean"],
        "mbu_forward": floor / forward_ms,
        "bytes_cost_model": setup.cost_model.iteration_cost(sched).bytes,
    }
