"""How many KV-cache blocks fit in memory.

The rule (DESIGN.md, "Block manager"): ``N_max = (M - W) / k`` tokens, with ``M`` the memory
given to the engine, ``W`` the weight bytes and ``k`` the KV bytes per token
(``2 * layers * kv_heads * head_dim * dtype_bytes``), rounded down to whole blocks.
"""

from __future__ import annotations

import torch

from ..model_config import DTYPE_BYTES, ModelConfig

GiB = 1 << 30
# Kept free on the GPU for activations, the logits of the largest batch, CUDA-graph pools and
# allocator fragmentation: none of that is known before the first iteration runs.
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GiB

_TORCH_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` or ``"bf16"`` -> ``"bf16"`` (the keys of ``DTYPE_BYTES``)."""
    name = _TORCH_DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, torch.dtype) else dtype
    if name not in DTYPE_BYTES:
        raise ValueError(f"unsupported KV dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
    return name


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype | str) -> int:
    """Bytes of one block across all layers, K and V."""
    return block_size * config.kv_bytes_per_token(dtype_name(dtype))


def num_kv_blocks_for_memory(
    config: ModelConfig, block_size: int, dtype: torch.dtype | str, memory_bytes: int
) -> int:
    """Blocks that fit in ``memory_bytes`` (M) after the weights (W): ``floor((M - W) / k)``
    tokens, rounded down to whole blocks of ``block_size``; 0 if the weights alone do not fit."""
    name = dtype_name(dtype)
    free_for_kv = memory_bytes - config.weight_bytes(name)
    if free_for_kv <= 0:
        return 0
    max_tokens = free_for_kv // config.kv_bytes_per_token(name)
    return int(max_tokens // block_size)


def startup_free_bytes(gpu_memory_utilization: float, device: torch.device | str | None = None) -> int:
    """The GPU's free bytes before the model loads, after vLLM V1's start check (gpu_worker.py,
    init_device): the engine is to have ``utilization * total`` bytes, so free memory below
    that (other processes hold the rest) refuses to start, rather than a smaller KV cache."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    free, total = torch.cuda.mem_get_info(device)
    requested = gpu_memory_utilization * total
    if free < requested:
        raise ValueError(
            f"free memory on the device ({free / GiB:.2f}/{total / GiB:.2f} GiB) at start is "
            f"less than --gpu-memory-utilization {gpu_memory_utilization} asks "
            f"({requested / GiB:.2f} GiB): lower it, or free the memory other processes hold"
        )
    return free


def cuda_num_kv_blocks(
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype | str,
    gpu_memory_utilization: float,
    free_at_start: int,
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
    device: torch.device | str | None = None,
) -> int:
    """KV blocks for a GPU, measured after the model is loaded (call it then, not before);
    ``free_at_start`` is startup_free_bytes' answer from before the load.

    Rule (vLLM V1's ``gpu_memory_utilization`` meaning, gpu_worker.py's
    determine_available_memory): the engine may use ``utilization * total`` bytes of the
    device in all. What this process took since the start (``free_at_start - free``: our
    weights, CUDA context growth) and an activation reserve come off that budget; other
    processes' memory does not (the start check refused if they left too little). The rest,
    divided by the KV bytes per block, is the block count::

        kv_bytes = utilization * total - (free_at_start - free) - activation_reserve
        blocks   = floor(kv_bytes / (block_size * k))

    Returns 0 when nothing is left (the caller should refuse to start). Checked against a
    faked torch.cuda.mem_get_info, not yet on a GPU.
    """
    free, total = torch.cuda.mem_get_info(device)
    ours = free_at_start - free
    kv_bytes = int(gpu_memory_utilization * total) - ours - activation_reserve_bytes
    if kv_bytes <= 0:
        return 0
    return int(kv_bytes // kv_block_bytes(config, block_size, dtype))
