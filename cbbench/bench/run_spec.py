"""What one benchmark run is asked to do (RunSpec): the option groups a command parsed and the
target they name. bench/runner.py executes it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cbbench.distributed.plan import LoadPlan
from cbbench.engine.args import EngineArgs
from cbbench.load.arrivals import Ramp
from cbbench.load.images import ImageSpec
from cbbench.load.synthetic import RandomSpec
from cbbench.targets.options import EndpointOptions

if TYPE_CHECKING:  # the groups' module imports typer: a run needs only their values
    from cbbench.options import EndpointFlags, LoadOptions, OutputOptions

DEFAULT_NUM_REQUESTS = 1000


@dataclass
class RunSpec:
    """The run's option groups as the command took them (--workload, --seed, ... in ``load``;
    --slo, --label, ... in ``output``), the engine, and the target the endpoint flags resolved
    to. The values that need parsing are parsed once, here, by their group's own parser (a
    UsageError naming the flag before anything runs); a change is a new RunSpec
    (dataclasses.replace, with_load, with_output), parsed again."""

    load: LoadOptions  # what to send and when
    engine: EngineArgs  # the bundled engine's options
    output: OutputOptions  # what is judged and written
    endpoint: EndpointOptions | None = None  # set: benchmark an HTTP endpoint, not the engine
    load_plan: LoadPlan = field(default_factory=LoadPlan)  # --workers, --ray (endpoint runs)

    # Parsed from the groups (__post_init__).
    request_rate: float = field(init=False)
    random: RandomSpec = field(init=False)  # --workload random's lengths
    images: ImageSpec | None = field(init=False)  # --workload random-mm's images
    duration_s: float | None = field(init=False)  # --duration: draw until the schedule reaches it
    ramp: Ramp | None = field(init=False)  # --ramp: a linear rate ramp instead of --request-rate
    slo: dict[str, float] = field(init=False)  # --slo: goodput's limits (ms)
    percentiles: tuple[float, ...] = field(init=False)  # every distribution's pNN keys
    slice_s: float | None = field(init=False)  # --slice: summary.slices of this length

    def __post_init__(self) -> None:
        load, out = self.load, self.output
        self.request_rate = load.rate()
        self.random = load.random_spec()
        self.images = load.image_spec()
        self.duration_s = load.duration_s()
        self.ramp = load.ramp_spec()
        self.slo = out.goodput_slo()
        self.percentiles = out.percentile_list()
        self.slice_s = out.slice_s()

    @classmethod
    def from_options(
        cls,
        load: LoadOptions,
        engine: EngineArgs,
        output: OutputOptions | None = None,
        endpoint: EndpointFlags | None = None,
    ) -> RunSpec:
        """The run a command's option groups describe. A group a command does not take
        (``None``) stands at its defaults; the endpoint flags become the HTTP target and its
        client workers, checked after the load and output groups."""
        from cbbench.options import OutputOptions

        spec = cls(load, engine, output if output is not None else OutputOptions())
        if endpoint is not None:
            spec.endpoint = endpoint.target(load.seed)
            spec.load_plan = endpoint.load_plan()
        return spec

    def with_load(self, **changes: Any) -> RunSpec:
        """This run with load options changed (a probe's rate, a point's seed)."""
        return dataclasses.replace(self, load=dataclasses.replace(self.load, **changes))

    def with_output(self, **changes: Any) -> RunSpec:
        """This run with output options changed."""
        return dataclasses.replace(self, output=dataclasses.replace(self.output, **changes))
