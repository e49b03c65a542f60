"""The bundled engine as a benchmark target: build it from options, replay requests, collect
per-request records and per-iteration records.

The simulated engine runs on a virtual clock (deterministic, as fast as the CPU allows); the
torch engine on the wall clock.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.load.workload import WorkloadRequest

ENGINES = ("auto", "sim", "torch")
DEFAULT_SIM_GPU = "h200"
DEFAULT_SIM_MODEL = "llama-3-8b"
# The torch engine on a CPU: a small random-weight model, so a real forward pass over the
# ShareGPT workload finishes in minutes on a laptop.
DEFAULT_CPU_MODEL = "small"
DEFAULT_CUDA_MODEL = "llama-3-8b"
# The CPU KV pool is zero-filled at start-up, so it is sized for the small CPU presets (512 MiB
# holds 512k tokens of the 'small' model) rather than for memory that is never used.
DEFAULT_CPU_KV_MEMORY_BYTES = 512 * 1024**2
# vLLM's --swap-space default: 4 GiB of CPU memory for swapped-out KV blocks.
DEFAULT_SWAP_SPACE_GIB = 4.0
GIB = 1024**3
PREEMPTION_MODES = ("recompute", "swap")
QUEUE_POLICIES = ("fcfs", "priority")


@dataclass
class EngineOptions:
    engine: str = "auto"
    model: str | None = None
    gpu: str | None = None
    scheduler: str = "continuous"
    chunked_prefill: bool = True
    kv_allocation: str = "paged"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    # scheduling policies (vLLM's --preemption-mode, --swap-space, --policy,
    # --enable-prefix-caching)
    preemption: str = "recompute"
    swap_space: float = DEFAULT_SWAP_SPACE_GIB  # GiB; used only with preemption "swap"
    policy: str = "fcfs"
    enable_prefix_caching: bool = False
    # torch engine
    device: str | None = None
    dtype: str | None = None
    attention_backend: str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    ignore_eos: bool = True
    cuda_graphs: bool = True
    # sim engine efficiency factors (None: documented defaults)
    eta_memory: float | None = None
    eta_compute: float | None = None
    iteration_overhead_us: float | None = None
    seed: int = 0
    resolved: dict = field(default_factory=dict)  # filled in by build_engine

    def to_config(self) -> dict:
        d = asdict(self)
        d["engine_requested"] = d["engine"]
        d.update(d.pop("resolved"))  # the resolved engine, model, GPU and sizes
        return d


def _cuda_available() -> bool:
    if "torch" not in sys.modules and os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve_engine(opts: EngineOptions, notice: Callable[[str], None]) -> str:
    if opts.engine not in ENGINES:
        raise UsageError(f"unknown engine {opts.engine!r}: use {', '.join(ENGINES)}")
    if opts.engine != "auto":
        return opts.engine
    if _cuda_available():
        return "torch"
    notice(
        f"no GPU found: running the torch engine on the CPU with the {DEFAULT_CPU_MODEL!r} "
        "random-weight preset (use --engine sim --gpu h200 for simulated H200 timing)"
    )
    return "torch"


def num_swap_blocks(opts: EngineOptions, block_bytes: int) -> int:
    """CPU blocks for swap preemption: --swap-space over the bytes of one KV block (0 when
    preemption recomputes)."""
    if opts.preemption != "swap":
        return 0
    return int(opts.swap_space * GIB // block_bytes)


def engine_config(
    opts: EngineOptions, max_model_len: int, num_blocks: int, num_cpu_blocks: int
):
    """The scheduler and engine configuration both engine kinds share (ValueError when the
    options do not make a valid engine). Returns (EngineConfig, token budget)."""
    from cbbench.engine.engine import EngineConfig
    from cbbench.engine.scheduler import SchedulerConfig, default_max_num_batched_tokens

    budget = opts.max_num_batched_tokens or default_max_num_batched_tokens(
        opts.chunked_prefill, max_model_len
    )
    sched = SchedulerConfig(
        max_model_len=max_model_len,
        policy=opts.scheduler,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=budget,
        chunked_prefill=opts.chunked_prefill,
        preemption_mode=opts.preemption,
        queue_policy=opts.policy,
    )
    config = EngineConfig(
        sched,
        num_blocks,
        opts.block_size,
        opts.kv_allocation,
        num_cpu_blocks=num_cpu_blocks,
        enable_prefix_caching=opts.enable_prefix_caching,
    )
    return config, budget


@dataclass
class EngineRun:
    records: list[RequestRecord]
    iterations: list[dict]
    duration_s: float
    interrupted: bool
    info: dict
    not_sent: int = 0


def build_engine(opts: EngineOptions, notice: Callable[[str], None]):
    """Returns (engine, info) for the resolved engine kind."""
    kind = resolve_engine(opts, notice)
    if kind == "sim":
        from cbbench.targets.sim_build import build_sim_engine

        return build_sim_engine(opts)
    from cbbench.targets.torch_build import build_torch_engine

    return build_torch_engine(opts, notice)


def _make_requests(
    wreqs: list[WorkloadRequest], arrivals: np.ndarray, opts: EngineOptions, info: dict
):
    from cbbench.engine.request import Request, SamplingParams

    needs_ids = info["engine"] == "torch"
    # The simulator computes no tokens, but prefix caching hashes prompt ids where the
    # workload has them.
    keep_ids = needs_ids or opts.enable_prefix_caching
    vocab = info.get("vocab_size", 0)
    eos = info.get("eos_token_id")
    reqs = []
    for w, t in zip(wreqs, arrivals):
        ids = None
        if needs_ids:
            if w.prompt_token_ids is not None:
                if max(w.prompt_token_ids) >= vocab:
                    raise UsageError(
                        f"request {w.id}: token id {max(w.prompt_token_ids)} is outside the "
                        f"model's vocabulary of {vocab}"
                    )
                ids = list(w.prompt_token_ids)
            elif w.prompt_len + w.output_len > info["max_model_len"]:
                ids = None  # rejected at arrival (beyond the context): never build its prompt
            else:
                # Length-only requests get synthetic ids, the same for every run of a seed.
                rng = np.random.default_rng([opts.seed, w.id])
                ids = rng.integers(0, vocab, w.prompt_len).tolist()
        elif keep_ids and w.prompt_token_ids is not None:
            ids = list(w.prompt_token_ids)
        sampling = SamplingParams(
            temperature=opts.temperature,
            top_p=opts.top_p,
            top_k=opts.top_k,
            seed=opts.seed,
            ignore_eos=opts.ignore_eos,
        )
        reqs.append(
            Request(
                w.id,
                w.prompt_len,
                w.output_len,
                arrival_time=float(t),
                prompt_token_ids=ids,
                sampling=sampling,
                priority=w.priority,
                eos_token_id=eos,
            )
        )
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time)  # stable
    return [reqs[i] for i in order]


def _drain(engine, grace_s: float) -> None:
    """After a stop: drop what has not started, let running requests finish for up to
    ``grace_s`` seconds of wall time, then abort the rest."""
    import time

    sched = engine.scheduler
    for req in list(sched.waiting):
        engine.abort_request(req)
    deadline = time.monotonic() + grace_s
    while engine.has_unfinished() and time.monotonic() < deadline:
        if engine.step() is None:
            break
    for req in list(sched.running) + list(sched.waiting):
        engine.abort_request(req)


def run_engine(
    opts: EngineOptions,
    wreqs: list[WorkloadRequest],
    arrivals: np.ndarray,
    notice: Callable[[str], None],
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    keep_token_ids: bool = False,
    on_start: Callable[[object], None] | None = None,
    grace_s: float = 10.0,
) -> EngineRun:
    """``on_start(clock)`` is called when the run's clock starts (telemetry lines up with it)."""
    from cbbench.engine.engine import run_until_done
    from cbbench.engine.request import RequestStatus

    engine, info = build_engine(opts, notice)
    opts.resolved = info
    reqs = _make_requests(wreqs, arrivals, opts, info)
    total = len(reqs)
    done = [0]

    def on_step(step) -> None:
        if step.finished and on_progress is not None:
            done[0] += len(step.finished)
            on_progress(done[0] + len(engine.rejected), total)

    clock = engine.clock
    if clock.realtime:
        clock.reset()
    if on_start is not None:
        on_start(clock)
    completed_all = run_until_done(engine, reqs, should_stop=should_stop, on_step=on_step)
    if not completed_all:
        _drain(engine, grace_s)
    end = clock.now()

    records = []
    not_sent = 0
    for r in reqs:
        if r.status == RequestStatus.WAITING and r.first_scheduled_time is None:
            # Never reached the engine (its arrival came after the stop).
            not_sent += 1
            continue
        error = error_type = None
        if r.status == RequestStatus.REJECTED:
            error, error_type = r.finish_reason, "rejected"
        elif r.status == RequestStatus.ABORTED:
            error, error_type = "cancelled by the interrupt", "interrupted"
        elif r.status != RequestStatus.FINISHED:
            error, error_type = "run interrupted before the request finished", "interrupted"
        records.append(
            RequestRecord(
                id=r.request_id,
                prompt_tokens=r.num_prompt_tokens,
                output_tokens=r.num_output_tokens,
                intended_start_s=r.arrival_time,
                send_s=r.arrival_time,
                token_times_s=r.token_times,
                error=error,
                error_type=error_type,
                output_token_ids=(
                    list(r.output_token_ids)
                    if keep_token_ids and r.prompt_token_ids is not None
                    else None
                ),
                num_preemptions=r.num_preemptions,
                first_scheduled_s=r.first_scheduled_time,
                priority=r.priority,
            )
        )
    finish_times = [r.finish_time for r in reqs if r.finish_time is not None]
    duration = end if not completed_all else max(finish_times, default=0.0)
    if math.isinf(duration):
        duration = 0.0
    iterations = [it.to_dict() for it in engine.records]
    return EngineRun(records, iterations, duration, not completed_all, info, not_sent)
