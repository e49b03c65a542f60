"""The torch engine: a real model (a preset with random weights, or a Hugging Face folder),
a paged KV cache and the model runner, on the wall clock, on CUDA or the CPU."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .args import EngineArgs, EngineArgsError
from .build_common import (
    DEFAULT_CPU_KV_MEMORY_BYTES,
    EngineInfo,
    engine_config,
    load_device_profile,
    num_swap_blocks,
)

if TYPE_CHECKING:
    import torch

# The torch engine on a CPU: a small random-weight model, so a real forward pass over the
# ShareGPT workload finishes in minutes on a laptop.

log = logging.getLogger(__name__)

DEFAULT_CPU_MODEL = "small"
DEFAULT_CUDA_MODEL = "llama-3-8b"
# The torch engine on a CPU runs one intra-op thread unless told otherwise: the CPU presets'
# matmuls are too small to split across threads, and OpenMP threads that spin at barriers
# collapse when other processes share the cores (measured 10-30x slower steps at 2 threads).
DEFAULT_CPU_THREADS = 1


def _device_free_bytes(device: str) -> int | None:
    """Memory the torch engine can still allocate on ``device``."""
    import torch

    from .memory_check import available_host_bytes

    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    return available_host_bytes()


# What the torch engine allocates per position of the context (the RoPE tables: angles, cos
# and sin, float32, head_dim / 2 each) and per sequence slot (its block-table row, int32 per
# block, plus the sampling and bookkeeping arrays).
ROPE_BYTES_PER_POSITION_DIM = 6
SLOT_BYTES = 128


def check_torch_sizes_before_load(args: EngineArgs, model_name: str, dtype_name: str,
                                  device: str) -> None:
    """The weights and the RoPE tables are allocated with the model: check them before. A
    preset's context may be stretched by --max-model-len; a folder's may not (load_model
    refuses a longer one, after this check, which sizes the folder's own)."""
    from .memory_check import require
    from .model_config import MODEL_PRESETS, get_model_config

    try:
        config = get_model_config(model_name)
    except ValueError:
        return  # not a model: load_model says why
    free = _device_free_bytes(device)
    require(f"--model {model_name} (the weights in {dtype_name})",
            config.weight_bytes(dtype_name), free, f"on {device}")
    context = config.max_model_len
    if model_name in MODEL_PRESETS and args.max_model_len is not None:
        context = args.max_model_len
    elif args.max_model_len is not None:
        context = min(context, args.max_model_len)
    need = context * config.head_dim * ROPE_BYTES_PER_POSITION_DIM
    flag = f"--max-model-len {context}" if args.max_model_len else f"the context of {context}"
    require(f"{flag} (the RoPE tables)", need, free, f"on {device}")


def check_torch_sizes(args: EngineArgs, config, device: str, num_blocks: int,
                      num_cpu_blocks: int, block_bytes: int) -> None:
    from .memory_check import available_host_bytes, require

    free = _device_free_bytes(device)
    what = f"--num-kv-blocks {num_blocks}" if args.num_kv_blocks else f"{num_blocks} KV blocks"
    require(f"{what} (the KV cache)", num_blocks * block_bytes, free, f"on {device}")
    host = available_host_bytes()
    require(f"--swap-space {args.swap_space:g} GiB (the CPU swap pool)",
            num_cpu_blocks * block_bytes, host, "on this host")
    blocks_per_seq = -(-config.max_model_len // args.block_size)
    require(f"--max-num-seqs {args.max_num_seqs} (the per-sequence slots)",
            args.max_num_seqs * (4 * blocks_per_seq + SLOT_BYTES), host, "on this host")


def _resolve_fused(args: EngineArgs, device: str, dtype_name: str, dtype: torch.dtype) -> bool:
    """--fused-kernels auto: on where the Triton kernels can run on a GPU; on asks for them,
    refused where they would not compute what the unfused model computes in ``dtype`` (bf16
    under the interpreter; auto never picks them there: it needs CUDA)."""
    from cbbench.kernels import available_backends, fused_layer_ops_unfaithful_reason

    triton_ok = "triton" in available_backends(device)
    if args.fused_kernels == "off":
        return False
    if args.fused_kernels == "on":
        if not triton_ok:
            raise EngineArgsError(
                f"--fused-kernels on: the Triton kernels cannot run on {device} here (CUDA with "
                "Triton, or TRITON_INTERPRET=1 on the CPU)"
            )
        unfaithful = fused_layer_ops_unfaithful_reason(dtype)
        if unfaithful is not None:
            raise EngineArgsError(
                f"--fused-kernels on with --dtype {dtype_name}: {unfaithful}; use "
                "--dtype fp32 or fp16 here, or run on a GPU (compiled Triton rounds)"
            )
        return True
    return triton_ok and device == "cuda"


# Attention backends whose forward and KV write stay on the device, as stream capture needs.
# flash-attn (untested on a GPU): mha_varlen_fwd reads only tensor shapes and host ints, so the
# graph bakes in max_seqlen_q = 1 and max_seqlen_k = max_model_len (its split-KV choice)
# while each sequence's length comes from the persistent cu_seqlens_k buffer at replay.
GRAPH_CAPTURABLE_BACKENDS = ("triton", "flash-attn")
# Why the others cannot be captured: their forward loops over the requests on the host.
HOST_LOOP_REASON = (
    "the {name!r} attention backend copies the batch's lengths to the host (.tolist()) in "
    "every forward, which stream capture forbids"
)


def _graphs_plan(args: EngineArgs, on_cuda: bool, backend) -> tuple[bool, str | None]:
    """Whether to capture decode graphs, else why not."""
    if not args.cuda_graphs:
        return False, "off (--no-cuda-graphs)"
    if not on_cuda:
        return False, "no CUDA device"
    # With a backend that syncs, decode runs eagerly rather than failing the capture.
    if backend.name not in GRAPH_CAPTURABLE_BACKENDS:
        return False, HOST_LOOP_REASON.format(name=backend.name)
    return True, None


def real_run_cost_model(args: EngineArgs, config, dtype: str, gpu, device: str):
    """The torch engine's cost model: analytic bytes/FLOPs, and predicted_s on the run's
    device — a --gpu-profile of this device, else the detected GPU's spec (None on a CPU)."""
    from .sim.cost_model import CostModel

    profile = load_device_profile(args)
    if profile is None:
        return CostModel(config, dtype, gpu)
    here = gpu.name if gpu is not None else ("cpu" if device == "cpu" else "an unknown GPU")
    if profile.device != here:
        raise EngineArgsError(
            f"--gpu-profile: the profile is of {profile.device!r}, this run is on {here}"
        )
    return CostModel(config, dtype, gpu, rates=profile.rates)


def _startup_free(args: EngineArgs) -> int:
    """The GPU's free bytes before the load, or one line (exit 2) where other processes leave
    less than --gpu-memory-utilization asks, as vLLM V1 refuses to start."""
    from .torch.kv_sizing import startup_free_bytes

    try:
        return startup_free_bytes(args.gpu_memory_utilization)
    except ValueError as e:
        raise EngineArgsError(str(e)) from None


def build_torch_engine(args: EngineArgs):
    import torch

    from cbbench.kernels import get_backend

    from .core.clock import WallClock
    from .core.engine import Engine
    from .sim.gpu_specs import match_device_name
    from .torch.kv_sizing import cuda_num_kv_blocks, kv_block_bytes, num_kv_blocks_for_memory
    from .torch.model_runner import ModelRunner
    from .torch.models.llama import allocate_kv_cache
    from .torch.models.loader import load_model, resolve_dtype

    cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if cuda else "cpu")
    if device == "cuda" and not cuda:
        raise EngineArgsError("--device cuda: no CUDA GPU is available to torch here")
    on_cuda = device == "cuda"
    cpu_threads = None
    if not on_cuda:
        cpu_threads = args.cpu_threads or DEFAULT_CPU_THREADS
        torch.set_num_threads(cpu_threads)
    dtype_name = args.dtype or ("bf16" if on_cuda else "fp32")
    dtype = resolve_dtype(dtype_name)
    model_name = args.model or (DEFAULT_CUDA_MODEL if on_cuda else DEFAULT_CPU_MODEL)
    try:
        backend = get_backend(args.attention_backend, device, block_size=args.block_size)
    except (ValueError, RuntimeError) as e:
        raise EngineArgsError(f"attention backend {args.attention_backend!r}: {e}") from None
    fused = _resolve_fused(args, device, dtype_name, dtype)
    check_torch_sizes_before_load(args, model_name, dtype_name, device)
    free_at_start = _startup_free(args) if on_cuda and not args.num_kv_blocks else 0
    torch.manual_seed(args.seed)
    try:
        model, config = load_model(
            model_name, dtype, device, backend, seed=args.seed,
            max_model_len=args.max_model_len, fused=fused,
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as e:
        raise EngineArgsError(str(e)) from None
    max_model_len = config.max_model_len

    if args.num_kv_blocks:
        num_blocks = args.num_kv_blocks
    elif on_cuda:
        num_blocks = cuda_num_kv_blocks(
            config, args.block_size, dtype, args.gpu_memory_utilization, free_at_start
        )
    else:
        memory = config.weight_bytes(dtype_name) + DEFAULT_CPU_KV_MEMORY_BYTES
        num_blocks = num_kv_blocks_for_memory(config, args.block_size, dtype, memory)
    if num_blocks < 1:
        raise EngineArgsError("no memory is left for the KV cache after the weights")
    num_cpu_blocks = num_swap_blocks(args, kv_block_bytes(config, args.block_size, dtype))
    check_torch_sizes(args, config, device, num_blocks, num_cpu_blocks,
                      kv_block_bytes(config, args.block_size, dtype))
    engine_cfg, budget = engine_config(args, max_model_len, num_blocks, num_cpu_blocks)
    use_graphs, graphs_reason = _graphs_plan(args, on_cuda, backend)
    if args.cuda_graphs and on_cuda and not use_graphs:
        log.info(f"CUDA graphs: {graphs_reason}; decode runs eagerly")
    if use_graphs and backend.name == "flash-attn":
        log.info(f"attention backend {backend.name} (asked: {args.attention_backend}) with decode "
               "CUDA graphs: untested on a GPU so far; --no-cuda-graphs runs it eagerly")  # fmt: skip
    kv_caches = allocate_kv_cache(config, num_blocks, args.block_size, dtype, device)
    runner = ModelRunner(
        model,
        config,
        kv_caches,
        args.block_size,
        device,
        dtype,
        use_cuda_graphs=use_graphs,
        max_num_seqs=args.max_num_seqs,
        sampler_seed=args.seed,
        max_num_batched_tokens=budget,
        async_scheduling=args.async_scheduling,
    )
    mixed_reason = graphs_reason
    if use_graphs and not runner.cuda_graphs_effective:
        graphs_reason = f"capture failed: {runner.graphs_fallback_reason}"
    if use_graphs and not runner.mixed_graphs_effective:
        mixed_reason = f"capture failed: {runner.mixed_graphs_fallback_reason}"
    if num_cpu_blocks:
        runner.allocate_swap_space(num_cpu_blocks)
    runner.warmup()

    gpu = match_device_name(torch.cuda.get_device_name(device)) if on_cuda else None
    cost = real_run_cost_model(args, config, dtype_name, gpu, device)
    drafter = None
    if args.speculative_tokens:
        from .core.spec_decode import NgramDrafter

        drafter = NgramDrafter(args.speculative_tokens)
        if args.acceptance_rate is not None:
            log.info(f"--acceptance-rate {args.acceptance_rate:g} is ignored by the torch engine: "
                   "it drafts by n-gram lookup and measures its own acceptance")  # fmt: skip
    engine = Engine(engine_cfg, runner, WallClock(), cost, drafter)
    info = EngineInfo(
        engine="torch",
        device=device,
        device_name=torch.cuda.get_device_name(device) if on_cuda else "cpu",
        gpu=gpu.name if gpu else None,
        gpu_spec=gpu.to_dict() if gpu else None,
        model=model_name,
        model_config=config.to_dict(),
        dtype=dtype_name,
        attention_backend=backend.name,
        attention_backend_requested=args.attention_backend,
        fused_kernels=fused,
        cuda_graphs=args.cuda_graphs,
        cuda_graphs_effective=runner.cuda_graphs_effective,
        cuda_graphs_reason=graphs_reason,
        cuda_graphs_mixed_effective=runner.mixed_graphs_effective,
        cuda_graphs_mixed_reason=mixed_reason,
        cpu_threads=cpu_threads,
        max_model_len=max_model_len,
        max_num_batched_tokens=budget,
        num_kv_blocks=num_blocks,
        kv_capacity_tokens=num_blocks * args.block_size,
        num_cpu_blocks=num_cpu_blocks,
        weight_bytes=config.weight_bytes(dtype_name),
        kv_bytes_per_token=config.kv_bytes_per_token(dtype_name),
        vocab_size=config.vocab_size,
        eos_token_ids=config.eos_token_ids,
        torch_version=torch.__version__,
        clock="wall",
        speculative_tokens=args.speculative_tokens or None,
    )
    return engine, info
