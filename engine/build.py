"""Build an engine from EngineArgs: the simulated GPU (a roofline on a virtual clock) or the
torch engine (a real model, a paged KV cache and the model runner on the wall clock).

Returns the engine and an :class:`EngineInfo`: what ``auto`` and the defaults resolved to. Any
option the engine cannot take raises :class:`EngineArgsError` with a one-line reason.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .args import EngineArgs, EngineArgsError, check_single_device

DEFAULT_SIM_GPU = "h200"
DEFAULT_SIM_MODEL = "llama-3-8b"
# The torch engine on a CPU: a small random-weight model, so a real forward pass over the
# ShareGPT workload finishes in minutes on a laptop.
DEFAULT_CPU_MODEL = "small"
DEFAULT_CUDA_MODEL = "llama-3-8b"
# The CPU KV pool is zero-filled at start-up, so it is sized for the small CPU presets (512 MiB
# holds 512k tokens of the 'small' model) rather than for memory that is never used.
DEFAULT_CPU_KV_MEMORY_BYTES = 512 * 1024**2
GIB = 1024**3
# The torch engine on a CPU runs one intra-op thread unless told otherwise: the CPU presets'
# matmuls are too small to split across threads, and OpenMP threads that spin at barriers
# collapse when other processes share the cores (measured 10-30x slower steps at 2 threads).
DEFAULT_CPU_THREADS = 1


@dataclass(frozen=True)
class EngineInfo:
    """What a built engine resolved to; it goes into the result's config beside the options."""

    engine: str  # sim | torch
    model: str
    model_config: dict
    dtype: str
    max_model_len: int
    max_num_batched_tokens: int
    num_kv_blocks: int
    kv_capacity_tokens: int
    num_cpu_blocks: int
    weight_bytes: int
    kv_bytes_per_token: int
    clock: str  # virtual | wall
    gpu: str | None = None
    gpu_spec: dict | None = None
    efficiency: dict | None = None  # sim
    device: str | None = None  # torch
    device_name: str | None = None
    attention_backend: str | None = None
    fused_kernels: bool | None = None
    cuda_graphs: bool | None = None
    cuda_graphs_effective: bool | None = None  # False: decode runs eagerly (reason below)
    cuda_graphs_reason: str | None = None
    # Piecewise graphs of mixed iterations (False: they run eagerly; reason below).
    cuda_graphs_mixed_effective: bool | None = None
    cuda_graphs_mixed_reason: str | None = None
    cpu_threads: int | None = None
    vocab_size: int | None = None
    eos_token_id: int | list[int] | None = None
    torch_version: str | None = None

    def to_dict(self) -> dict:
        """The fields this engine kind sets (None fields left out, except gpu)."""
        return {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if v is not None or k in ("gpu", "gpu_spec")
        }


def cuda_available() -> bool:
    if "torch" not in sys.modules and os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve_engine(args: EngineArgs, notice: Callable[[str], None]) -> str:
    """``auto`` -> torch (on CUDA when present, else on the CPU with a notice)."""
    if args.engine != "auto":
        return args.engine
    if not cuda_available():
        notice(
            f"no GPU found: running the torch engine on the CPU with the {DEFAULT_CPU_MODEL!r} "
            "random-weight preset (use --engine sim --gpu h200 for simulated H200 timing)"
        )
    return "torch"


def num_swap_blocks(args: EngineArgs, block_bytes: int) -> int:
    """CPU blocks for swap preemption: --swap-space over the bytes of one KV block (0 when
    preemption recomputes)."""
    if args.preemption != "swap":
        return 0
    return int(args.swap_space * GIB // block_bytes)


def engine_config(args: EngineArgs, max_model_len: int, num_blocks: int, num_cpu_blocks: int):
    """The scheduler and engine configuration both engine kinds share. Returns (EngineConfig,
    token budget)."""
    from .engine import EngineConfig
    from .scheduler_config import SchedulerConfig, default_max_num_batched_tokens

    budget = args.max_num_batched_tokens or default_max_num_batched_tokens(
        args.chunked_prefill, max_model_len
    )
    try:
        sched = SchedulerConfig(
            max_model_len=max_model_len,
            batching=args.scheduler,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=budget,
            chunked_prefill=args.chunked_prefill,
            preemption_mode=args.preemption,
            queue_policy=args.policy,
        )
        config = EngineConfig(
            sched,
            num_blocks,
            args.block_size,
            args.kv_allocation,
            num_cpu_blocks=num_cpu_blocks,
            enable_prefix_caching=args.enable_prefix_caching,
        )
    except ValueError as e:
        raise EngineArgsError(str(e)) from None
    return config, budget


def build_engine(args: EngineArgs, notice: Callable[[str], None]):
    """Returns (Engine, EngineInfo) for the resolved engine kind: one engine replica (data
    parallelism is engine.replicas.build_replicas)."""
    args.validate()
    kind = resolve_engine(args, notice)
    if kind == "torch":
        check_single_device(args)
    if args.data_parallel_size > 1:
        raise EngineArgsError(
            f"--data-parallel-size {args.data_parallel_size}: this command runs one engine "
            "replica (benchmark runs take data parallelism: run, compare, sweep, capacity)"
        )
    if kind == "sim":
        return build_sim_engine(args)
    load_device_profile(args)  # a bad profile fails before the model loads
    return build_torch_engine(args, notice)


def build_replicas(args: EngineArgs, notice: Callable[[str], None]):
    """Data parallelism: ``--data-parallel-size`` simulated engines behind ``--router``, as
    one (ReplicaSet, EngineInfo of one replica)."""
    from .replicas import ReplicaSet

    args.validate()
    if resolve_engine(args, notice) == "torch":
        check_single_device(args)
    one = dataclasses.replace(args, data_parallel_size=1)
    built = [build_sim_engine(one) for _ in range(args.data_parallel_size)]
    return ReplicaSet([engine for engine, _ in built], args.router), built[0][1]


def load_device_profile(args: EngineArgs):
    """The --gpu-profile's DeviceProfile, or None (its problems as EngineArgsError)."""
    if args.gpu_profile is None:
        return None
    from .device_profile import load_profile

    try:
        return load_profile(args.gpu_profile)
    except ValueError as e:
        raise EngineArgsError(f"--gpu-profile: {e}") from None


def cpu_num_kv_blocks(model, block_size: int, dtype: str) -> int:
    """The torch engine's CPU KV pool (DEFAULT_CPU_KV_MEMORY_BYTES beside the weights), so a
    simulated CPU holds what the real one did."""
    return DEFAULT_CPU_KV_MEMORY_BYTES // model.kv_bytes_per_token(dtype) // block_size


def sim_device(args: EngineArgs, profile):
    """(GPUSpec or None for a profiled CPU, DeviceRates, efficiency dict for the result)."""
    from .cost_model import DeviceRates, Efficiency
    from .gpu_specs import get_gpu_spec

    if profile is not None:
        if args.gpu is not None and args.gpu.lower() != profile.device:
            raise EngineArgsError(
                f"--gpu {args.gpu} and a --gpu-profile of {profile.device!r}: choose one"
            )
        gpu = None if profile.is_cpu else get_gpu_spec(profile.device)
        info = {"source": "profile", "device": profile.device, **profile.rates.to_dict()}
        return gpu, profile.rates, info
    try:
        gpu = get_gpu_spec(args.gpu or DEFAULT_SIM_GPU)
    except ValueError as e:
        raise EngineArgsError(str(e)) from None
    defaults = Efficiency()
    eff = Efficiency(
        eta_memory=args.eta_memory if args.eta_memory is not None else defaults.eta_memory,
        eta_compute=args.eta_compute if args.eta_compute is not None else defaults.eta_compute,
        overhead_s=(
            args.iteration_overhead_us * 1e-6
            if args.iteration_overhead_us is not None
            else defaults.overhead_s
        ),
    )
    info = {
        "eta_memory": eff.eta_memory,
        "eta_compute": eff.eta_compute,
        "iteration_overhead_us": eff.overhead_s * 1e6,
    }
    return gpu, DeviceRates.from_spec(gpu, eff), info


def build_sim_engine(args: EngineArgs):
    from .clock import VirtualClock
    from .cost_model import CostModel
    from .engine import Engine
    from .model_config import get_model_config
    from .sim_executor import SimExecutor, sim_num_kv_blocks

    profile = load_device_profile(args)
    gpu, rates, efficiency = sim_device(args, profile)
    try:
        model = get_model_config(
            args.model or (profile.models[0] if profile else DEFAULT_SIM_MODEL)
        )
    except ValueError as e:
        raise EngineArgsError(str(e)) from None
    dtype = args.dtype or (profile.dtype if profile else "bf16")
    tp = args.tensor_parallel_size
    try:
        cost = CostModel(model, dtype, gpu, rates=rates, tensor_parallel_size=tp)
    except ValueError as e:
        raise EngineArgsError(f"--tensor-parallel-size {tp}: {e}") from None
    max_model_len = args.max_model_len or model.max_model_len
    try:
        if args.num_kv_blocks:
            num_blocks = args.num_kv_blocks
        elif gpu is None:
            num_blocks = cpu_num_kv_blocks(model, args.block_size, dtype)
        else:
            num_blocks = sim_num_kv_blocks(
                model, gpu, args.block_size, dtype, args.gpu_memory_utilization,
                tensor_parallel_size=tp,
            )
    except ValueError as e:
        raise EngineArgsError(str(e)) from None
    if num_blocks < 1:
        raise EngineArgsError(
            f"no KV block fits: a block of --block-size {args.block_size} tokens is larger than "
            f"the {gpu.name}'s memory left for the KV cache"
        )
    block_bytes = args.block_size * model.kv_bytes_per_token(dtype)
    num_cpu_blocks = num_swap_blocks(args, block_bytes)
    check_sim_sizes(args, num_blocks, num_cpu_blocks)
    config, budget = engine_config(args, max_model_len, num_blocks, num_cpu_blocks)
    engine = Engine(config, SimExecutor(cost, args.block_size), VirtualClock(), cost)
    info = EngineInfo(
        engine="sim",
        gpu=gpu.name if gpu is not None else profile.device,
        gpu_spec=gpu.to_dict() if gpu is not None else None,
        model=model.name,
        model_config=model.to_dict(),
        dtype=dtype,
        max_model_len=max_model_len,
        max_num_batched_tokens=budget,
        num_kv_blocks=num_blocks,
        kv_capacity_tokens=num_blocks * args.block_size,
        num_cpu_blocks=num_cpu_blocks,
        weight_bytes=cost.weight_bytes(),
        kv_bytes_per_token=model.kv_bytes_per_token(dtype),
        efficiency=efficiency,
        clock="virtual",
    )
    return engine, info


def check_sim_sizes(args: EngineArgs, num_blocks: int, num_cpu_blocks: int) -> None:
    """The simulator's pools cost host memory for their bookkeeping only."""
    from .memory_check import BLOCK_BOOKKEEPING_BYTES, available_host_bytes, require

    host = available_host_bytes()
    require(f"--num-kv-blocks {num_blocks} (the KV pool's bookkeeping)",
            num_blocks * BLOCK_BOOKKEEPING_BYTES, host, "on this host")
    require(f"--swap-space {args.swap_space:g} GiB ({num_cpu_blocks} blocks of bookkeeping)",
            num_cpu_blocks * BLOCK_BOOKKEEPING_BYTES, host, "on this host")


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
    preset's context may be stretched by --max-model-len (a folder's own context caps it)."""
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


def _resolve_fused(args: EngineArgs, device: str) -> bool:
    """--fused-kernels auto: on where the Triton kernels can run on a GPU; on asks for them."""
    from cbbench.kernels import available_backends

    triton_ok = "triton" in available_backends(device)
    if args.fused_kernels == "off":
        return False
    if args.fused_kernels == "on":
        if not triton_ok:
            raise EngineArgsError(
                f"--fused-kernels on: the Triton kernels cannot run on {device} here (CUDA with "
                "Triton, or TRITON_INTERPRET=1 on the CPU)"
            )
        return True
    return triton_ok and device == "cuda"


def _graphs_plan(args: EngineArgs, on_cuda: bool, backend) -> tuple[bool, str | None]:
    """Whether to capture decode graphs, else why not."""
    if not args.cuda_graphs:
        return False, "off (--no-cuda-graphs)"
    if not on_cuda:
        return False, "no CUDA device"
    # Only the triton backend's KV write and attention are free of host syncs, which capture
    # requires; with another backend decode runs eagerly rather than failing.
    if backend.name != "triton":
        return False, f"the {backend.name!r} attention backend syncs with the host"
    return True, None


def real_run_cost_model(args: EngineArgs, config, dtype: str, gpu, device: str):
    """The torch engine's cost model: analytic bytes/FLOPs, and predicted_s on the run's
    device — a --gpu-profile of this device, else the detected GPU's spec (None on a CPU)."""
    from .cost_model import CostModel

    profile = load_device_profile(args)
    if profile is None:
        return CostModel(config, dtype, gpu)
    here = gpu.name if gpu is not None else ("cpu" if device == "cpu" else "an unknown GPU")
    if profile.device != here:
        raise EngineArgsError(
            f"--gpu-profile: the profile is of {profile.device!r}, this run is on {here}"
        )
    return CostModel(config, dtype, gpu, rates=profile.rates)


def build_torch_engine(args: EngineArgs, notice: Callable[[str], None]):
    import torch

    from cbbench.kernels import get_backend

    from .clock import WallClock
    from .engine import Engine
    from .gpu_specs import match_device_name
    from .kv_sizing import cuda_num_kv_blocks, kv_block_bytes, num_kv_blocks_for_memory
    from .model_runner import ModelRunner
    from .models.llama import allocate_kv_cache
    from .models.loader import load_model, resolve_dtype

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
    fused = _resolve_fused(args, device)
    check_torch_sizes_before_load(args, model_name, dtype_name, device)
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
        num_blocks = cuda_num_kv_blocks(config, args.block_size, dtype, args.gpu_memory_utilization)
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
        notice(f"CUDA graphs: {graphs_reason}; decode runs eagerly")
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
        notice=notice,
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
    engine = Engine(engine_cfg, runner, WallClock(), cost)
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
        eos_token_id=config.eos_token_id,
        torch_version=torch.__version__,
        clock="wall",
    )
    return engine, info
