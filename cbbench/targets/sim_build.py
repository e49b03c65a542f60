"""Build the simulated engine: a named GPU, a model preset, a roofline, a virtual clock."""

from __future__ import annotations

from cbbench.engine.clock import VirtualClock
from cbbench.engine.cost_model import Efficiency
from cbbench.errors import UsageError
from cbbench.targets.engine import (
    DEFAULT_SIM_GPU,
    DEFAULT_SIM_MODEL,
    EngineOptions,
    engine_config,
    num_swap_blocks,
)


def build_sim_engine(opts: EngineOptions):
    from cbbench.engine.cost_model import CostModel
    from cbbench.engine.engine import Engine
    from cbbench.engine.gpu_specs import get_gpu_spec
    from cbbench.engine.model_config import get_model_config
    from cbbench.engine.sim_executor import SimExecutor, sim_num_kv_blocks

    try:
        gpu = get_gpu_spec(opts.gpu or DEFAULT_SIM_GPU)
        model = get_model_config(opts.model or DEFAULT_SIM_MODEL)
    except ValueError as e:
        raise UsageError(str(e)) from None
    dtype = opts.dtype or "bf16"
    defaults = Efficiency()
    eff = Efficiency(
        eta_memory=opts.eta_memory if opts.eta_memory is not None else defaults.eta_memory,
        eta_compute=opts.eta_compute if opts.eta_compute is not None else defaults.eta_compute,
        overhead_s=(
            opts.iteration_overhead_us * 1e-6
            if opts.iteration_overhead_us is not None
            else defaults.overhead_s
        ),
    )
    if not (0 < eff.eta_memory <= 1 and 0 < eff.eta_compute <= 1) or eff.overhead_s < 0:
        raise UsageError("efficiency factors must be in (0, 1] and the overhead >= 0")
    max_model_len = opts.max_model_len or model.max_model_len
    try:
        num_blocks = opts.num_kv_blocks or sim_num_kv_blocks(
            model, gpu, opts.block_size, dtype, opts.gpu_memory_utilization
        )
        block_bytes = opts.block_size * model.kv_bytes_per_token(dtype)
        num_cpu_blocks = num_swap_blocks(opts, block_bytes)
        config, budget = engine_config(opts, max_model_len, num_blocks, num_cpu_blocks)
        cost = CostModel(model, dtype, gpu, eff)
        engine = Engine(config, SimExecutor(cost, opts.block_size), VirtualClock(), cost)
    except ValueError as e:
        raise UsageError(str(e)) from None
    info = {
        "engine": "sim",
        "gpu": gpu.name,
        "gpu_spec": gpu.to_dict(),
        "model": model.name,
        "model_config": model.to_dict(),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": budget,
        "num_kv_blocks": num_blocks,
        "kv_capacity_tokens": num_blocks * opts.block_size,
        "num_cpu_blocks": num_cpu_blocks,
        "weight_bytes": cost.weight_bytes(),
        "kv_bytes_per_token": model.kv_bytes_per_token(dtype),
        "efficiency": {
            "eta_memory": eff.eta_memory,
            "eta_compute": eff.eta_compute,
            "iteration_overhead_us": eff.overhead_s * 1e6,
        },
        "clock": "virtual",
    }
    return engine, info
