"""RunSpec is the parsed option groups (issue 36): it holds the load and output groups as the
command took them, parses what needs parsing once, on construction, and a change is a new spec
parsed again. A sweep's probes and a replay set their values through the groups' text: the
text must parse back to the very numbers (the results stay identical for the same seed)."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from cbbench.analysis.summary.slo import AttainmentSLO
from cbbench.bench.probe import ProbeSizing, probe_spec
from cbbench.bench.run_spec import RunSpec
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.options import LoadOptions, OutputOptions

SIM = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b")


def test_no_option_is_held_twice():
    """RunSpec's own fields are the groups, the engine and the target: none repeats an option
    (a new flag then needs only its group's field)."""
    own = {f.name for f in fields(RunSpec) if f.init}
    options = {f.name for group in (LoadOptions, OutputOptions) for f in fields(group)}
    assert own == {"load", "output", "engine", "endpoint", "load_plan"}
    assert not (own - {"load", "output"}) & options  # (--output is the output group's path)


def test_the_groups_are_held_and_parsed_once():
    load = LoadOptions(workload="random", request_rate="2.5", duration="90s", input_len=64)
    output = OutputOptions(slo="ttft=500,tpot=50", percentiles="50,99.9", slice="10s",
                           label="x")
    spec = RunSpec.from_options(load, SIM, output)
    assert spec.load is load and spec.output is output and spec.engine is SIM
    assert spec.request_rate == 2.5 and spec.duration_s == 90.0 and spec.ramp is None
    assert spec.random.input_len == 64 and spec.images is None
    assert spec.slo == {"ttft": 500.0, "tpot": 50.0}
    assert spec.percentiles == (50, 99.9) and spec.slice_s == 10.0
    assert spec.endpoint is None and not spec.load_plan.distributed


@pytest.mark.parametrize("load, output, message", [
    (LoadOptions(request_rate="fast"), OutputOptions(), "invalid request rate"),
    (LoadOptions(input_len=10), OutputOptions(), "--input-len applies only to --workload random"),
    (LoadOptions(ramp="1:2"), OutputOptions(), "ramp"),
    (LoadOptions(), OutputOptions(slice="1us"), "--slice"),
    (LoadOptions(), OutputOptions(slo="ttft_p99=5"), "_pNN suffix"),
])
def test_a_bad_value_is_refused_when_the_spec_is_made(load, output, message):
    """Before anything runs, whoever builds the spec (a command, a probe, a test)."""
    with pytest.raises(UsageError, match=message):
        RunSpec(load, SIM, output)


def test_a_change_is_parsed_again():
    spec = RunSpec(LoadOptions(request_rate="4"), SIM, OutputOptions())
    faster = spec.with_load(request_rate="inf", seed=7)
    assert faster.request_rate == math.inf and faster.load.seed == 7
    assert spec.request_rate == 4.0 and spec.load.seed == 0  # the original stands
    assert spec.with_output(slice="2s").slice_s == 2.0
    with pytest.raises(UsageError, match="invalid request rate"):
        spec.with_load(request_rate="-1")


@pytest.mark.parametrize("rate", [1 / 3, 0.1 + 0.2, 1e-3, 12345.678901234567, 7.0, math.inf])
def test_a_probe_gets_its_rate_and_slo_exactly(rate):
    """The probe's rate and the SLO's limits pass through the groups' text: repr, so each
    parses back to the same float (a probe's arrivals and goodput bit for bit as before)."""
    base = RunSpec(LoadOptions(workload="sharegpt", num_requests=10, arrival="gamma"), SIM,
                   OutputOptions(label="sweep"))
    slo = AttainmentSLO({"ttft": 1 / 7, "e2el": 2500.0}, 0.99)
    spec = probe_spec(base, rate, ProbeSizing(num_requests=10), slo)
    assert spec.request_rate == rate
    assert spec.slo == slo.limits_ms and list(spec.slo) == ["ttft", "e2el"]
    assert spec.load.num_requests == ProbeSizing(num_requests=10).requests_for(rate)
    assert spec.output.label == "sweep" and spec.load.arrival == "gamma"
    assert probe_spec(base, rate, ProbeSizing(num_requests=10), None).slo == {}
