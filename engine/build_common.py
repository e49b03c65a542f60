"""What both engine builders share: the :class:`EngineInfo` they return, the scheduler and
engine configuration, the swap pool's size, the --gpu-profile, and the CPU KV pool's size
(the torch engine allocates it; the simulator sizes a simulated CPU the same)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .args import EngineArgs, EngineArgsError
from .model_config import eos_record

# The CPU KV pool is zero-filled at start-up, so it is sized for the small CPU presets (512 MiB
# holds 512k tokens of the 'small' model) rather than for memory that is never used.
DEFAULT_CPU_KV_MEMORY_BYTES = 512 * 1024**2
GIB = 1024**3


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
    weight_bytes: float
    kv_bytes_per_token: int
    clock: str  # virtual | wall
    gpu: str | None = None
    gpu_spec: dict | None = None
    efficiency: dict | None = None  # sim
    device: str | None = None  # torch
    device_name: str | None = None
    attention_backend: str | None = None
    attention_backend_requested: str | None = None  # e.g. auto (attention_backend: its choice)
    fused_kernels: bool | None = None
    cuda_graphs: bool | None = None
    cuda_graphs_effective: bool | None = None  # False: decode runs eagerly (reason below)
    cuda_graphs_reason: str | None = None
    # Piecewise graphs of mixed iterations (False: they run eagerly; reason below).
    cuda_graphs_mixed_effective: bool | None = None
    cuda_graphs_mixed_reason: str | None = None
    cpu_threads: int | None = None
    vocab_size: int | None = None
    # The model's end-of-sequence ids (model_config.py); None where the engine does not model
    # EOS (sim). Recorded as eos_record writes them.
    eos_token_ids: tuple[int, ...] | None = None
    torch_version: str | None = None
    # Speculative decoding: K, and the acceptance rate the simulator draws from (None: off).
    speculative_tokens: int | None = None
    acceptance_rate: float | None = None

    def to_dict(self) -> dict:
        """The fields this engine kind sets (None fields left out, except gpu)."""
        d = dataclasses.asdict(self)
        del d["eos_token_ids"]
        if self.eos_token_ids is not None:
            d.update(eos_record(self.eos_token_ids))
        return {k: v for k, v in d.items() if v is not None or k in ("gpu", "gpu_spec")}


def num_swap_blocks(args: EngineArgs, block_bytes: int) -> int:
    """CPU blocks for swap preemption: --swap-space over the bytes of one KV block (0 when
    preemption recomputes)."""
    if args.preemption != "swap":
        return 0
    return int(args.swap_space * GIB // block_bytes)


def engine_config(args: EngineArgs, max_model_len: int, num_blocks: int, num_cpu_blocks: int):
    """The scheduler and engine configuration both engine kinds share. Returns (EngineConfig,
    token budget)."""
    from .core.engine import EngineConfig
    from .core.scheduler_config import SchedulerConfig, default_max_num_batched_tokens

    budget = args.max_num_batched_tokens or default_max_num_batched_tokens(
        args.chunked_prefill, max_model_len
    )
    try:
        sched = SchedulerConfig(
            max_model_len=max_model_len,
            batching=args.batching,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=budget,
            chunked_prefill=args.chunked_prefill,
            preemption_mode=args.preemption,
            queue_policy=args.queue_policy,
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


# A device profile is a few hundred bytes; anything far larger is not one.
PROFILE_MAX_BYTES = 1 << 20


def load_device_profile(args: EngineArgs):
    """The --gpu-profile's DeviceProfile, or None (its problems as EngineArgsError)."""
    if args.gpu_profile is None:
        return None
    from .json_file import read_json
    from .sim.device_profile import load_profile

    try:
        # Vetted by the capped reader first: /dev/zero or 100k nested brackets as a profile were
        # a MemoryError / RecursionError traceback inside load_profile.
        read_json(args.gpu_profile, "device profile", PROFILE_MAX_BYTES)
        return load_profile(args.gpu_profile)
    except ValueError as e:
        raise EngineArgsError(f"--gpu-profile: {e}") from None


def cpu_num_kv_blocks(model, block_size: int, dtype: str) -> int:
    """The torch engine's CPU KV pool (DEFAULT_CPU_KV_MEMORY_BYTES beside the weights), so a
    simulated CPU holds what the real one did."""
    return DEFAULT_CPU_KV_MEMORY_BYTES // model.kv_bytes_per_token(dtype) // block_size
