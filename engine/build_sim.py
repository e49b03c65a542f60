"""The simulated engine: a roofline cost model of a named GPU (or a calibrated device
profile) on a virtual clock."""

from __future__ import annotations

from .args import EngineArgs, EngineArgsError
from .build_common import (
    EngineInfo,
    cpu_num_kv_blocks,
    engine_config,
    load_device_profile,
    num_swap_blocks,
)

DEFAULT_SIM_GPU = "h200"
DEFAULT_SIM_MODEL = "llama-3-8b"


def sim_device(args: EngineArgs, profile):
    """(GPUSpec or None for a profiled CPU, DeviceRates, efficiency dict for the result)."""
    from .sim.cost_model import DeviceRates, Efficiency
    from .sim.gpu_specs import get_gpu_spec

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
    return gpu, DeviceRates.from_spec(gpu, eff, args.dtype or "bf16"), info


def build_sim_engine(args: EngineArgs):
    from .core.clock import VirtualClock
    from .core.engine import Engine
    from .model_config import get_model_config
    from .sim.cost_model import CostModel
    from .sim.sim_executor import SimExecutor, sim_num_kv_blocks

    profile = load_device_profile(args)
    gpu, rates, efficiency = sim_device(args, profile)
    try:
        model = get_model_config(
            args.model or (profile.models[0] if profile else DEFAULT_SIM_MODEL)
        )
    except ValueError as e:
        raise EngineArgsError(str(e)) from None
    dtype = args.dtype or (profile.dtype if profile else "bf16")
    tp, ep = args.tensor_parallel_size, args.expert_parallel_size
    try:
        cost = CostModel(model, dtype, gpu, rates=rates, tensor_parallel_size=tp,
                         expert_parallel_size=ep)
    except ValueError as e:
        flag = f"--expert-parallel-size {ep}" if ep > 1 else f"--tensor-parallel-size {tp}"
        raise EngineArgsError(f"{flag}: {e}") from None
    max_model_len = args.max_model_len or model.max_model_len
    try:
        if args.num_kv_blocks:
            num_blocks = args.num_kv_blocks
        elif gpu is None:
            num_blocks = cpu_num_kv_blocks(model, args.block_size, dtype)
        else:
            num_blocks = sim_num_kv_blocks(
                model, gpu, args.block_size, dtype, args.gpu_memory_utilization,
                tensor_parallel_size=tp, expert_parallel_size=ep,
            )
    except ValueError as e:
        raise EngineArgsError(str(e)) from None
    if num_blocks < 1:
        raise EngineArgsError(
            f"no KV block fits: a block of --block-size {args.block_size} tokens is larger than "
            f"the {gpu.name}'s memory left for the KV cache"
        )
    # vLLM V0 divides --swap-space (GiB per GPU) by one GPU's cache block: its shard of the
    # KV heads under tensor parallelism, as the cost model's swap time moves.
    block_bytes = args.block_size * cost.kv_bytes_per_token_per_gpu
    num_cpu_blocks = num_swap_blocks(args, block_bytes)
    check_sim_sizes(args, num_blocks, num_cpu_blocks)
    config, budget = engine_config(args, max_model_len, num_blocks, num_cpu_blocks)
    acceptance, drafter = sim_speculation(args)
    executor = SimExecutor(cost, args.block_size, acceptance)
    engine = Engine(config, executor, VirtualClock(), cost, drafter)
    if args.fast_forward:  # decode-only stretches in one move (Engine.fast_forward)
        engine.decode_cost_model = executor
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
        speculative_tokens=args.speculative_tokens or None,
        acceptance_rate=acceptance.rate if acceptance is not None else None,
    )
    return engine, info


def sim_speculation(args: EngineArgs):
    """(SimAcceptance, SimDrafter) with --speculative-tokens, else (None, None). The drafter
    is free on the simulated GPU: a draft model's forward is not modelled (n-gram lookup and
    placeholder drafts are host work of microseconds per request; docs/speculative.md)."""
    if not args.speculative_tokens:
        return None, None
    from .core.spec_decode import DEFAULT_SIM_ACCEPTANCE_RATE, SimAcceptance, SimDrafter

    rate = args.acceptance_rate
    if rate is None:
        rate = DEFAULT_SIM_ACCEPTANCE_RATE
    return SimAcceptance(rate, args.seed), SimDrafter(args.speculative_tokens)


def check_sim_sizes(args: EngineArgs, num_blocks: int, num_cpu_blocks: int) -> None:
    """The simulator's pools cost host memory for their bookkeeping only."""
    from .memory_check import BLOCK_BOOKKEEPING_BYTES, available_host_bytes, require

    host = available_host_bytes()
    require(f"--num-kv-blocks {num_blocks} (the KV pool's bookkeeping)",
            num_blocks * BLOCK_BOOKKEEPING_BYTES, host, "on this host")
    require(f"--swap-space {args.swap_space:g} GiB ({num_cpu_blocks} blocks of bookkeeping)",
            num_cpu_blocks * BLOCK_BOOKKEEPING_BYTES, host, "on this host")
