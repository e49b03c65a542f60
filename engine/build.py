"""Build an engine from EngineArgs: the simulated GPU (a roofline on a virtual clock,
:mod:`.build_sim`) or the torch engine (a real model, a paged KV cache and the model runner on
the wall clock, :mod:`.build_torch`).

Returns the engine and an :class:`EngineInfo`: what ``auto`` and the defaults resolved to. Any
option the engine cannot take raises :class:`EngineArgsError` with a one-line reason.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from .args import EngineArgs, EngineArgsError, check_single_device
from .build_common import EngineInfo, load_device_profile
from .build_sim import build_sim_engine
from .build_torch import DEFAULT_CPU_MODEL, build_torch_engine
from .core.engine_like import EngineLike

log = logging.getLogger(__name__)

__all__ = ["EngineInfo", "build_engine", "build_replicas", "cuda_available", "resolve_engine"]


def cuda_available() -> bool:
    if "torch" not in sys.modules and os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve_engine(args: EngineArgs) -> str:
    """``auto`` -> torch (on CUDA when present, else on the CPU with a notice)."""
    if args.engine != "auto":
        return args.engine
    if not cuda_available():
        log.info(
            f"no GPU found: running the torch engine on the CPU with the {DEFAULT_CPU_MODEL!r} "
            "random-weight preset (use --engine sim --gpu h200 for simulated H200 timing)"
        )
    return "torch"


def build_engine(args: EngineArgs):
    """Returns (Engine, EngineInfo) for the resolved engine kind: one engine replica (data
    parallelism is engine.replicas.build_replicas)."""
    args.validate()
    kind = resolve_engine(args)
    if kind == "torch":
        check_single_device(args)
    if args.data_parallel_size > 1 or args.disaggregate is not None:
        raise EngineArgsError(
            f"--data-parallel-size {args.data_parallel_size} / --disaggregate: this command "
            "runs one engine "
            "replica (benchmark runs take data parallelism: run, compare, sweep, capacity)"
        )
    if kind == "sim":
        return build_sim_engine(args)
    load_device_profile(args)  # a bad profile fails before the model loads
    return build_torch_engine(args)


def build_replicas(args: EngineArgs) -> tuple[EngineLike, EngineInfo]:
    """Data parallelism: ``--data-parallel-size`` simulated engines behind ``--router``, as
    one (ReplicaSet, EngineInfo of one replica)."""
    from .sim.replicas import ReplicaSet

    args.validate()
    if resolve_engine(args) == "torch":
        check_single_device(args)
    if args.router == "prefix-aware" and not args.enable_prefix_caching:
        raise EngineArgsError("--router prefix-aware routes by the replicas' prefix caches: "
                              "add --enable-prefix-caching")
    one = dataclasses.replace(args, data_parallel_size=1, disaggregate=None)
    pd = args.disaggregation
    if pd is not None:
        return _build_disaggregated(args, one, pd)
    first = build_sim_engine(one)
    _check_replica_memory(args.data_parallel_size, first[1])
    built = [first, *(build_sim_engine(one) for _ in range(args.data_parallel_size - 1))]
    engines = [engine for engine, _ in built]
    return ReplicaSet(engines, args.router, args.router_max_imbalance), built[0][1]


def _build_disaggregated(args: EngineArgs, one: EngineArgs,
                         pd: tuple[int, int]) -> tuple[EngineLike, EngineInfo]:
    """--disaggregate P:D: P prefill and D decode simulated engines, alike, with the KV link
    between them. Returns (DisaggregatedSet, EngineInfo of one instance)."""
    from .sim.disaggregated import DisaggregatedSet
    from .sim.kv_link import get_kv_link

    first = build_sim_engine(one)
    info = first[1]
    _check_replica_memory(sum(pd), info)
    engines = [first[0], *(build_sim_engine(one)[0] for _ in range(sum(pd) - 1))]
    tp, ep = args.tensor_parallel_size, args.expert_parallel_size
    # Past as many GPUs as KV heads, tensor parallelism replicates heads (vLLM): only
    # num_kv_heads GPUs hold distinct KV, so only that many links share a request's transfer.
    # Expert parallelism keeps attention data-parallel: a request's whole KV sits on one GPU
    # and crosses its one link; the ep GPUs send their own requests side by side (ep lanes).
    kv_links = min(tp, int(info.model_config["num_kv_heads"]))
    return DisaggregatedSet(
        engines[: pd[0]], engines[pd[0]:], get_kv_link(args.kv_link), info.kv_bytes_per_token,
        tp * ep, args.router, args.router_max_imbalance, kv_links, kv_lanes=ep,
    ), info


def _check_replica_memory(replicas: int, info: EngineInfo) -> None:
    """Every replica has its own KV pools' bookkeeping: `--data-parallel-size 10000` took 20 GB
    of the host, building replicas for minutes, before this check."""
    from .memory_check import BLOCK_BOOKKEEPING_BYTES, available_host_bytes, require

    per_replica = (info.num_kv_blocks + info.num_cpu_blocks) * BLOCK_BOOKKEEPING_BYTES
    require(f"--data-parallel-size {replicas} ({info.num_kv_blocks} KV blocks of bookkeeping "
            "each)", replicas * per_replica, available_host_bytes(), "on this host")
