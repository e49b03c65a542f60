"""EngineArgs: every engine option in one place — its type, default, choices, range and help.

The CLI derives the options of `run`, `serve`, `compare`, `sweep` and `capacity` from these
fields (cbbench/cli/options.py), and :mod:`.build` builds an engine from them, so adding an
option is one field here plus its use. ``validate()`` rejects a bad value before anything runs.

Field metadata (all optional): ``help``; ``choices`` (a tuple; None stays allowed when the
default is None); ``low``/``high`` with ``low_open`` for an open lower bound; ``cli=False``
for a field the CLI sets from elsewhere (the command's own ``--seed``); ``flag`` where the
flag and the result-file key keep an older name than the field (``batching`` is
``--scheduler`` and config["scheduler"]; ``queue_policy`` is ``--policy`` and "policy").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .errors import InputError

ENGINES = ("auto", "sim", "torch")
SCHEDULERS = ("continuous", "static")
KV_ALLOCATIONS = ("paged", "reserved")
PREEMPTION_MODES = ("recompute", "swap")
QUEUE_POLICIES = ("fcfs", "priority")
DEVICES = ("cpu", "cuda")
DTYPES = ("bf16", "fp16", "fp32")
ROUTERS = ("round-robin", "least-requests", "least-kv", "prefix-aware")
# Kept equal to cbbench.kernels.BACKEND_NAMES (a test checks): importing kernels imports torch,
# which the simulated path never does.
ATTENTION_BACKENDS = ("auto", "reference", "torch", "triton", "flash-attn")
SWITCHES = ("auto", "on", "off")

# vLLM's serving defaults.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BLOCK_SIZE = 16
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_SWAP_SPACE_GIB = 4.0
MAX_SEED = 2**63 - 1  # torch.manual_seed takes an int64
# Speculative decoding: draft tokens per request per step. vLLM's n-gram and EAGLE setups use
# 1..8; beyond 16 almost every draft is rejected (A^16 < 0.03 at A = 0.8) and the verify rows
# only cost budget.
MAX_SPECULATIVE_TOKENS = 16


# An option value the engine cannot take: the one bad-input type (engine/errors.py).
EngineArgsError = InputError


# Far beyond any host's cores: torch.set_num_threads(10**8) crashed the process (SIGSEGV) and
# libgomp cannot create 20,000 threads.
MAX_CPU_THREADS = 1024


def opt(default, help: str, **meta):
    """A dataclass field carrying its CLI help and checks in its metadata."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class EngineArgs:
    engine: str = opt(
        "auto", "auto | torch | sim. auto: torch on CUDA if present, else torch on the CPU.",
        choices=ENGINES,
    )
    model: str | None = opt(
        None,
        "Model preset (llama-3-8b, llama-3.2-1b, qwen2.5-7b, ...) or a Hugging Face folder. "
        "Default: llama-3-8b (sim, CUDA), 'small' (CPU).",
    )
    gpu: str | None = opt(None, "Simulated GPU: a100-80gb, h100, h200, ... Default: h200.")
    # The batching mode (SchedulerConfig.batching); its flag is vLLM-era --scheduler.
    batching: str = opt(
        "continuous", "continuous (iteration-level) | static (batch at a time).",
        choices=SCHEDULERS, flag="--scheduler",
    )
    chunked_prefill: bool = opt(True, "Split long prompts across iterations so decodes keep moving.")
    kv_allocation: str = opt(
        "paged", "paged (grow block by block) | reserved (prompt + max output at admission).",
        choices=KV_ALLOCATIONS,
    )
    max_num_batched_tokens: int | None = opt(
        None,
        "Token budget per iteration. Default as vLLM below 70 GiB and on A100: 2048 with "
        "chunked prefill, else max(max_model_len, 2048) (vllm serve on H100/H200: 8192).",
        low=1,
    )
    max_num_seqs: int = opt(
        DEFAULT_MAX_NUM_SEQS, "Most requests running at once (vLLM's default: 256; on H100/H200: 1024).", low=1
    )
    block_size: int = opt(DEFAULT_BLOCK_SIZE, "Tokens per KV block.", low=1)
    num_kv_blocks: int | None = opt(None, "KV pool size in blocks. Default: derived from memory.", low=1)
    max_model_len: int | None = opt(None, "Context length. Default: the model's.", low=1)
    gpu_memory_utilization: float = opt(
        DEFAULT_GPU_MEMORY_UTILIZATION,
        "Fraction of GPU memory for weights + KV cache (vLLM's default 0.9).",
        low=0.0, low_open=True, high=1.0,
    )
    # Scheduling policies (vLLM's --preemption-mode, --swap-space, --policy,
    # --enable-prefix-caching).
    preemption: str = opt(
        "recompute",
        "When KV runs out: recompute (free the victim's KV; it recomputes on resume) | swap "
        "(copy its KV to CPU memory and back; recompute when the swap space is full).",
        choices=PREEMPTION_MODES,
    )
    swap_space: float = opt(
        DEFAULT_SWAP_SPACE_GIB,
        "CPU swap space in GiB per GPU for --preemption swap (vLLM's default 4).",
        low=0.0,
    )
    # The queue order (SchedulerConfig.queue_policy); its flag is vLLM's --policy.
    queue_policy: str = opt(
        "fcfs",
        "Queue order: fcfs | priority (admit by each request's priority, lower first, ties by "
        "arrival; a request short of KV preempts a lower-priority running one).",
        choices=QUEUE_POLICIES, flag="--policy",
    )
    enable_prefix_caching: bool = opt(
        False,
        "Reuse the KV of full blocks shared with earlier requests (needs token ids: workloads "
        "with prompt_token_ids, or the torch engine).",
    )
    # Speculative decoding (vLLM's --speculative-config num_speculative_tokens).
    speculative_tokens: int = opt(
        0,
        "Speculative decoding: draft tokens proposed per running request per step, verified "
        "as K+1 query rows of that request in the same forward (0 = off). The torch engine "
        "drafts by n-gram prompt lookup; the simulator draws acceptance from "
        "--acceptance-rate.",
        low=0, high=MAX_SPECULATIVE_TOKENS,
    )
    acceptance_rate: float | None = opt(
        None,
        "sim, with --speculative-tokens: probability that a draft token is accepted given "
        "that the ones before it were (default 0.7). The torch engine measures its own.",
        low=0.0, high=1.0,
    )
    # The torch engine.
    device: str | None = opt(
        None, "torch engine: cpu | cuda. Default: cuda if present.", choices=DEVICES
    )
    dtype: str | None = opt(
        None, "bf16 | fp16 | fp32. Default: bf16 on CUDA, fp32 on the CPU.", choices=DTYPES
    )
    attention_backend: str = opt(
        "auto", "auto | reference | torch | triton | flash-attn (torch engine).",
        choices=ATTENTION_BACKENDS,
    )
    temperature: float = opt(0.0, "Sampling temperature; 0 = greedy.", low=0.0)
    top_p: float = opt(1.0, "Nucleus sampling threshold.", low=0.0, low_open=True, high=1.0)
    top_k: int = opt(0, "Top-k sampling; 0 or -1 = off (as vLLM).", low=-1)
    ignore_eos: bool = opt(
        True, "Benchmark runs ignore EOS so output lengths follow the workload."
    )
    cuda_graphs: bool = opt(True, "Replay CUDA graphs for decode.")
    async_scheduling: bool = opt(
        False,
        "torch engine: prepare step n+1's inputs while step n runs on the device (vLLM v1's "
        "async scheduling; the sampled tokens are the only dependency). Same tokens and "
        "records either way. Off by default until a GPU run measures it (docs/async_scheduling.md).",
    )
    fused_kernels: str = opt(
        "auto",
        "torch engine: the fused Triton layer kernels (residual add + RMSNorm, RoPE + KV store, "
        "SiLU-and-mul): auto | on | off. auto: on with CUDA where Triton can run, off on the CPU.",
        choices=SWITCHES,
    )
    cpu_threads: int | None = opt(
        None,
        "torch engine on the CPU: intra-op threads. Default 1: the CPU presets' matmuls are too "
        "small to split, and spinning OpenMP threads collapse when cores are shared.",
        low=1, high=MAX_CPU_THREADS,
    )
    # The simulated engine's efficiency factors (None: the documented defaults).
    eta_memory: float | None = opt(
        None, "sim: fraction of peak HBM bandwidth reached (default 0.80).",
        low=0.0, low_open=True, high=1.0,
    )
    eta_compute: float | None = opt(
        None, "sim: fraction of peak FLOP/s reached (default 0.60).",
        low=0.0, low_open=True, high=1.0,
    )
    iteration_overhead_us: float | None = opt(
        None, "sim: fixed overhead per iteration in µs (default 300).", low=0.0
    )
    gpu_profile: str | None = opt(
        None,
        "A device profile from `cbbench calibrate`: the simulator runs on the calibrated "
        "device (a fitted CPU included), and a real run on that device predicts each "
        "iteration with it (predicted_s, summary.engine.sim_error).",
    )
    # More than one GPU (the simulator; the torch engine runs on one device).
    tensor_parallel_size: int = opt(
        1,
        "sim: GPUs each replica's weights and KV heads are split over (two all-reduces per "
        "layer over the GPU's interconnect).",
        low=1,
    )
    expert_parallel_size: int = opt(
        1,
        "sim, mixture-of-experts models: GPUs each replica spreads its experts over (whole "
        "experts per GPU, attention data-parallel across them, an all-to-all dispatch and "
        "combine per MoE layer over the GPU's interconnect).",
        low=1,
    )
    data_parallel_size: int = opt(
        1, "sim: independent engine replicas behind a router, one result.", low=1
    )
    fast_forward: bool = opt(
        True,
        "sim: advance stretches of pure-decode iterations (no arrival, finish, preemption or "
        "chunk boundary in them) in one move, records and all; --no-fast-forward steps every "
        "iteration (the reference: both give the same run).",
    )
    disaggregate: str | None = opt(
        None,
        "sim: P:D disaggregated prefill and decode: P prefill instances and D decode "
        "instances (each --tensor-parallel-size GPUs, its own queue); a request's KV moves "
        "over --kv-link after its prefill and it decodes where --router sends it.",
    )
    kv_link: str = opt(
        "nvlink",
        "With --disaggregate: the link KV moves over, per GPU: nvlink (450 GB/s, 10 us) | "
        "pcie (Gen5 x16, 64 GB/s, 10 us) | infiniband (NDR 400 Gb/s: 50 GB/s, 5 us) | roce "
        "(400 GbE: 50 GB/s, 10 us).",
    )
    router: str = opt(
        "round-robin",
        "With --data-parallel-size > 1: round-robin | least-requests (fewest unfinished "
        "requests) | least-kv (lowest KV-cache use) | prefix-aware (most of the request's "
        "leading blocks in the replica's prefix cache, within --router-max-imbalance; needs "
        "--enable-prefix-caching).",
        choices=ROUTERS,
    )
    router_max_imbalance: int = opt(
        16,
        "--router prefix-aware: a replica wins on its cache only with at most this many more "
        "unfinished requests than the least-loaded replica.",
        low=0,
    )
    seed: int = opt(
        0, "Engine seed: random weights, synthetic prompts, sampling.", low=0, high=MAX_SEED,
        cli=False,
    )

    def validate(self) -> EngineArgs:
        """Raise EngineArgsError naming the first bad option; return self when all are good."""
        for f in dataclasses.fields(self):
            problem = check_value(f, getattr(self, f.name))
            if problem is not None:
                raise EngineArgsError(f"{field_flag(f)} {problem}")
        if self.engine == "torch":
            check_single_device(self)
        if self.acceptance_rate is not None and self.speculative_tokens == 0:
            raise EngineArgsError(
                "--acceptance-rate needs --speculative-tokens K > 0 (speculation is off)"
            )
        self._check_disaggregation()
        if self.gpu_profile is not None:
            rate_flags = [flag_of(n) for n in SIM_RATE_FIELDS if getattr(self, n) is not None]
            if rate_flags:
                raise EngineArgsError(
                    f"{rate_flags[0]} and --gpu-profile both set the simulator's rates: "
                    "choose one"
                )
        return self

    def _check_disaggregation(self) -> None:
        from .sim.kv_link import get_kv_link, parse_disaggregate

        try:
            get_kv_link(self.kv_link)
            if self.disaggregate is not None:
                parse_disaggregate(self.disaggregate)
        except ValueError as e:
            raise EngineArgsError(f"--kv-link {e}" if "KV link" in str(e) else str(e)) from None
        if self.disaggregate is not None and self.data_parallel_size > 1:
            raise EngineArgsError("--disaggregate P:D sets the instances: use it without "
                                  "--data-parallel-size")

    @property
    def disaggregation(self) -> tuple[int, int] | None:
        """(prefill instances, decode instances), or None when colocated."""
        from .sim.kv_link import parse_disaggregate

        return parse_disaggregate(self.disaggregate) if self.disaggregate else None

    @property
    def num_gpus(self) -> int:
        """GPUs the deployment holds: instances x GPUs per instance."""
        pd = self.disaggregation
        instances = sum(pd) if pd else self.data_parallel_size
        return instances * self.tensor_parallel_size * self.expert_parallel_size

    def to_dict(self) -> dict:
        """The result file's config keys: each field under its flag's name (scheduler, policy)."""
        return {RESULT_KEYS.get(k, k): v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def field_of(cls, key: str) -> str:
        """The field a result-config key (or a flag's name) stands for."""
        return FIELD_OF_KEY.get(key, key)


# Fields whose flag and result key keep the older name (one name per concept inside).
RESULT_KEYS = {"batching": "scheduler", "queue_policy": "policy"}
FIELD_OF_KEY = {v: k for k, v in RESULT_KEYS.items()}


SIM_RATE_FIELDS = ("eta_memory", "eta_compute", "iteration_overhead_us")


def check_single_device(args: EngineArgs) -> None:
    """The torch engine runs on one device: tensor and data parallelism are simulated only."""
    if args.disaggregate is not None:
        raise EngineArgsError("--disaggregate: the torch engine runs on one device for now; "
                              "use --engine sim to simulate disaggregated prefill and decode")
    for name in ("tensor_parallel_size", "expert_parallel_size", "data_parallel_size"):
        if getattr(args, name) > 1:
            raise EngineArgsError(
                f"{flag_of(name)} {getattr(args, name)}: the torch engine runs on one device "
                "for now; use --engine sim to simulate more than one GPU"
            )


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def field_flag(f: dataclasses.Field) -> str:
    """A field's flag: its metadata's ``flag`` where the name differs, else from the name."""
    return f.metadata.get("flag") or flag_of(f.name)


def range_text(low, high, low_open: bool) -> str:
    """'>= 1', '> 0', '<= 1', or an interval such as '(0, 1]'."""
    def num(v) -> str:  # integers exactly (a seed's bound is 2^63 - 1, not 9.22337e+18)
        return str(v) if isinstance(v, int) else f"{v:g}"

    if high is None:
        return f"{'>' if low_open else '>='} {num(low)}"
    if low is None:
        return f"<= {num(high)}"
    return f"in {'(' if low_open else '['}{num(low)}, {num(high)}]"


# An EngineArgs field's annotation -> the Python types its values may have.
_KINDS: dict[str, type | tuple[type, ...]] = {"bool": bool, "int": int, "float": (int, float), "str": str}
_KIND_NAMES = {bool: "true or false", int: "an integer", (int, float): "a number", str: "text"}


def check_value(f: dataclasses.Field, value) -> str | None:
    """Why ``value`` is not acceptable for field ``f`` (a phrase after the flag), or None."""
    meta = f.metadata
    if value is None:
        return None if f.default is None else "needs a value"
    kind = _KINDS[str(f.type).removesuffix(" | None")]
    # The CLI parses each flag to its type; values from a file (a replayed result's config)
    # or the Python API may be anything: 'x' for an int was a TypeError from the range check.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        return f"must be {_KIND_NAMES[kind]}, got {value!r}"
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(choices)}, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    low, high, low_open = meta.get("low"), meta.get("high"), meta.get("low_open", False)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and value > high
    if too_low or too_high:
        return f"must be {range_text(low, high, low_open)}, got {value}"
    return None
