"""Build the torch engine: a real model (preset with random weights, or a Hugging Face folder),
a paged KV cache, the model runner, and the wall clock."""

from __future__ import annotations

from collections.abc import Callable

from cbbench.errors import UsageError
from cbbench.targets.engine import (
    DEFAULT_CPU_KV_MEMORY_BYTES,
    DEFAULT_CPU_MODEL,
    DEFAULT_CUDA_MODEL,
    EngineOptions,
    engine_config,
    num_swap_blocks,
)


def build_torch_engine(opts: EngineOptions, notice: Callable[[str], None]):
    import torch

    from cbbench.engine.clock import WallClock
    from cbbench.engine.cost_model import CostModel
    from cbbench.engine.engine import Engine
    from cbbench.engine.gpu_specs import match_device_name
    from cbbench.engine.kv_sizing import (
        cuda_num_kv_blocks,
        kv_block_bytes,
        num_kv_blocks_for_memory,
    )
    from cbbench.engine.model_runner import ModelRunner
    from cbbench.engine.models.llama import allocate_kv_cache
    from cbbench.engine.models.loader import load_model, resolve_dtype
    from cbbench.kernels import get_backend

    cuda = torch.cuda.is_available()
    device = opts.device or ("cuda" if cuda else "cpu")
    if device == "cuda" and not cuda:
        raise UsageError("--device cuda: no CUDA GPU is available to torch here")
    on_cuda = device == "cuda"
    dtype_name = opts.dtype or ("bf16" if on_cuda else "fp32")
    dtype = resolve_dtype(dtype_name)
    model_name = opts.model or (DEFAULT_CUDA_MODEL if on_cuda else DEFAULT_CPU_MODEL)
    try:
        backend = get_backend(opts.attention_backend, device, block_size=opts.block_size)
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"attention backend {opts.attention_backend!r}: {e}") from None
    torch.manual_seed(opts.seed)
    try:
        model, config = load_model(
            model_name, dtype, device, backend, seed=opts.seed, max_model_len=opts.max_model_len
        )
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    max_model_len = config.max_model_len

    if opts.num_kv_blocks:
        num_blocks = opts.num_kv_blocks
    elif on_cuda:
        num_blocks = cuda_num_kv_blocks(
            config, opts.block_size, dtype, opts.gpu_memory_utilization
        )
    else:
        memory = config.weight_bytes(dtype_name) + DEFAULT_CPU_KV_MEMORY_BYTES
        num_blocks = num_kv_blocks_for_memory(config, opts.block_size, dtype, memory)
    if num_blocks < 1:
        raise UsageError("no memory is left for the KV cache after the weights")
    # Only the triton backend's KV write and attention are free of host syncs, which CUDA graph
    # capture requires; with another backend decode runs eagerly rather than failing.
    use_graphs = opts.cuda_graphs and on_cuda and backend.name == "triton"
    if opts.cuda_graphs and on_cuda and not use_graphs:
        notice(f"CUDA graphs need the triton attention backend; {backend.name!r} decodes eagerly")
    kv_caches = allocate_kv_cache(config, num_blocks, opts.block_size, dtype, device)
    runner = ModelRunner(
        model,
        config,
        kv_caches,
        opts.block_size,
        device,
        dtype,
        use_cuda_graphs=use_graphs,
        max_num_seqs=opts.max_num_seqs,
        sampler_seed=opts.seed,
    )
    num_cpu_blocks = num_swap_blocks(opts, kv_block_bytes(config, opts.block_size, dtype))
    if num_cpu_blocks:
        runner.allocate_swap_space(num_cpu_blocks)
    runner.warmup()

    gpu = match_device_name(torch.cuda.get_device_name(device)) if on_cuda else None
    try:
        engine_cfg, budget = engine_config(opts, max_model_len, num_blocks, num_cpu_blocks)
        engine = Engine(engine_cfg, runner, WallClock(), CostModel(config, dtype_name, gpu))
    except ValueError as e:
        raise UsageError(str(e)) from None
    info = {
        "engine": "torch",
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if on_cuda else "cpu",
        "gpu": gpu.name if gpu else None,
        "gpu_spec": gpu.to_dict() if gpu else None,
        "model": model_name,
        "model_config": config.to_dict(),
        "dtype": dtype_name,
        "attention_backend": backend.name,
        "cuda_graphs": runner.use_cuda_graphs,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": budget,
        "num_kv_blocks": num_blocks,
        "kv_capacity_tokens": num_blocks * opts.block_size,
        "num_cpu_blocks": num_cpu_blocks,
        "weight_bytes": config.weight_bytes(dtype_name),
        "kv_bytes_per_token": config.kv_bytes_per_token(dtype_name),
        "vocab_size": config.vocab_size,
        "eos_token_id": config.eos_token_id,
        "torch_version": torch.__version__,
        "clock": "wall",
    }
    return engine, info
