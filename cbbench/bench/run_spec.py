"""What one benchmark run is asked to do (RunSpec): the workload, the arrivals, the target and
what the result holds. bench/runner.py executes it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES
from cbbench.distributed.plan import LoadPlan
from cbbench.engine.args import EngineArgs
from cbbench.load.arrivals import Ramp
from cbbench.load.images import ImageSpec
from cbbench.load.synthetic import RandomSpec
from cbbench.targets.options import EndpointOptions

if TYPE_CHECKING:
    from cbbench.options import EndpointFlags, LoadOptions, OutputOptions

DEFAULT_NUM_REQUESTS = 1000


@dataclass
class RunSpec:
    workload: str = "sharegpt"
    num_requests: int | None = DEFAULT_NUM_REQUESTS
    seed: int = 0
    request_rate: float = math.inf
    rate_given: bool = False
    burstiness: float = 1.0
    arrival: str = "auto"
    time_scale: float = 1.0  # --arrival trace: multiplies the trace's timestamps
    think_time: str | None = None  # session workloads: --think-time (None: the default)
    tool_time_scale: float = 1.0  # agent sessions: --tool-time-scale (tool_time_ms times X)
    cancel_rate: float | None = None  # --cancel-rate: share of requests cancelled mid-stream
    cancel_after: str | None = None  # --cancel-after: ms after the send (N, exp:MEAN, ...)
    warmup_s: float | None = None  # steady-state window set by hand: [warmup, end - cooldown]
    cooldown_s: float | None = None
    random: RandomSpec = field(default_factory=RandomSpec)  # --workload random
    slo: dict = field(default_factory=dict)
    save_detailed: bool = False
    label: str | None = None
    engine: EngineArgs = field(default_factory=EngineArgs)
    endpoint: EndpointOptions | None = None  # set: benchmark an HTTP endpoint, not the engine
    gpu_index: int | None = None
    telemetry_interval_s: float = 0.05
    gpu_metrics: list[str] | None = None  # --gpu-metrics: DCGM exporter pages, not NVML
    duration_s: float | None = None  # --duration: draw requests until the schedule reaches it
    ramp: Ramp | None = None  # --ramp: a linear rate ramp instead of --request-rate
    load: LoadPlan = field(default_factory=LoadPlan)  # --workers, --ray (endpoint runs)
    replay: str | None = None  # --replay: a recorded run's requests and arrivals instead
    percentiles: tuple = DEFAULT_PERCENTILES  # --percentiles: every distribution's pNN keys
    slice_s: float | None = None  # --slice: summary.slices of this length
    server_log: str | None = None  # --server-log: the server's request log, for ttft_parts
    images: ImageSpec | None = None  # --workload random-mm's images

    @classmethod
    def from_options(
        cls,
        load: LoadOptions,
        engine: EngineArgs,
        output: OutputOptions | None = None,
        endpoint: EndpointFlags | None = None,
        **overrides: Any,
    ) -> RunSpec:
        """The run a command's option groups describe. A field named as an option takes the
        option's value as it is (a new option needs only its group's field and this class's
        field of the same name); the parsed ones are read below, each by its group's parser.
        A group a command does not take (``None``) stands at its defaults, which are this
        class's; ``overrides`` set what a command decides itself (sweep's label, compare's
        request count)."""
        from cbbench.options import OutputOptions

        out = output if output is not None else OutputOptions()
        given: dict[str, Any] = {}
        for group in (load, out):
            given |= {f.name: getattr(group, f.name) for f in fields(group)}
        spec: dict[str, Any] = {f.name: given[f.name] for f in fields(cls) if f.name in given}
        spec |= dict(
            request_rate=load.rate(),
            rate_given=load.rate_given,
            random=load.random_spec(),
            images=load.image_spec(),
            duration_s=load.duration_s(),
            ramp=load.ramp_spec(),
            replay=str(load.replay) if load.replay is not None else None,
            slo=out.goodput_slo(),
            warmup_s=out.warmup,
            cooldown_s=out.cooldown,
            telemetry_interval_s=out.telemetry_interval,
            percentiles=out.percentile_list(),
            slice_s=out.slice_s(),
            server_log=str(out.server_log) if out.server_log is not None else None,
            engine=engine,
        )
        if endpoint is not None:
            spec |= dict(endpoint=endpoint.target(load.seed), load=endpoint.load_plan())
        return cls(**(spec | overrides))
