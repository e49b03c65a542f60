"""`cbbench sweep`: one workload at several request rates, with the latency-throughput curve."""

from __future__ import annotations

import contextlib
import datetime as _dt
from pathlib import Path
from typing import Annotated

import typer

from cbbench import options as O
from cbbench.cli import options as C
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.interrupts import StopSignal
from cbbench.options.load import PROBE_ARRIVALS

DEFAULT_OUT_PARENT = Path("results") / "runs"  # git ignores it: sweeps are scratch
MAX_POINTS = 100  # each point is a whole run: more is a typo (10^9 points ran out of memory)
# The output flags a sweep's and a capacity search's probes take (their telemetry included).
PROBE_OUTPUT = ("slo", "attainment", "label", "gpu_metrics", "telemetry_interval")

def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)


@O.with_options(
    O.Group(O.LoadOptions, "load", **O.PROBE_LOAD),
    O.Group(O.ProbeOptions, "probe"),
    O.Group(O.OutputOptions, "output", only=PROBE_OUTPUT, help={
        "slo": "SLO in ms for goodput and attainment, e.g. ttft_p99=1000,tpot_p99=50.",
        "label": "A name for this sweep's runs.",
    }),
    O.Group(O.EndpointFlags, "endpoint", **O.PROBE_ENDPOINT),
    O.engine_group(),
)
def sweep(
    rates: Annotated[
        str,
        typer.Option(
            help="Comma-separated request rates (inf: all at t=0), or auto: a rate-inf probe "
            "measures saturation, then --points rates from 10% to 95% of it."
        ),
    ] = "auto",
    points: Annotated[int, typer.Option(help="--rates auto: how many rates.")] = 6,
    out_dir: Annotated[
        Path | None,
        typer.Option(help="Folder for rate-<r>.json, sweep.json and the plot. "
                     "Default: results/runs/sweep-<time>."),
    ] = None,
    *,
    load: O.LoadOptions,
    probe: O.ProbeOptions,
    output: O.OutputOptions,
    endpoint: O.EndpointFlags,
    engine_opts: EngineArgs,
) -> None:
    """Run one workload at several request rates: latency against throughput.

    Fresh prompts at every rate (--reuse-prompts: the same requests), on a fresh engine per
    point (--endpoint: --reset-prefix-cache empties the server's prefix cache first). Prints latency percentiles,
    throughput and goodput per rate, and saves each run, a summary (sweep.json) and a
    latency-throughput plot. Points that never reach a steady state (the queue still growing
    when arrivals stop) are flagged.
    """
    from cbbench.analysis.result import (
        check_folder_not_inputs,
        check_writable,
        engine_inputs,
        write_atomic,
    )
    from cbbench.bench.probe import ProbeSizing
    from cbbench.bench.sweep import (
        PLOT_FILE,
        POINT_FILES,
        SWEEP_FILE,
        check_no_folder_at,
        parse_rates,
        point_file,
        points_of,
        run_sweep,
        sweep_table,
        unsteady_notes,
    )
    from cbbench.report.sweep_plot import latency_throughput, png_bytes

    rate_list = parse_rates(rates)
    if rate_list is not None and C.given("points"):  # it would do nothing: say so
        raise UsageError(f"--points sets how many rates --rates auto spreads; with --rates "
                         f"{rates} it does nothing: drop it")
    if rate_list is None and not 1 <= points <= MAX_POINTS:
        raise UsageError(f"--points must be in [1, {MAX_POINTS}], got {points}")
    slo_spec = output.attainment_slo()
    assert load.num_requests is not None  # PROBE_LOAD gives it a default: a probe has a size
    sizing = ProbeSizing(load.num_requests, probe.min_duration, probe.max_requests)
    for r in rate_list or []:
        sizing.check_schedule(r)
    base = base_spec(load, output, endpoint, engine_opts)
    prep = point_prep(probe)
    prep.check(base)
    folder = out_dir or DEFAULT_OUT_PARENT / _dt.datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out-dir {folder} is a file; give a folder")
    check_writable(folder / SWEEP_FILE)
    check_writable(folder / PLOT_FILE)  # a folder there failed the sweep after every point
    # The points' files: --rates names them; auto's rates are measured, so any such name.
    names = [POINT_FILES] if rate_list is None else [point_file(r) for r in rate_list]
    check_no_folder_at(folder, names, "a point's result", "--out-dir")
    check_folder_not_inputs(folder, [SWEEP_FILE, PLOT_FILE, POINT_FILES],
                            [load.workload, endpoint.tokenizer, *engine_inputs(engine_opts)], "--out-dir")

    with StopSignal() as stop, probes_context(base.load_plan):
        result = run_sweep(base, rate_list, points, sizing, slo_spec, folder, stop, prep)
    pts = points_of(result)
    write_atomic(folder / PLOT_FILE,
                 png_bytes(latency_throughput([(folder.name, result)])))
    if result.saturation_rate is not None:
        typer.echo(f"saturation (rate inf): ~{result.saturation_rate:.4g} req/s")
    if slo_spec is not None:
        typer.echo(f"SLO: {slo_spec.describe()}")
    typer.echo("latencies in ms")
    typer.echo(sweep_table(pts))
    for note in unsteady_notes(pts):
        typer.echo(f"note: {note}")
    if result.interrupted:
        typer.echo(f"interrupted: the sweep stopped after {len(pts)} point(s); the last one "
                   "covers only what finished")
    typer.echo(f"\nsweep: {folder / SWEEP_FILE}\nplot: {folder / PLOT_FILE}")


def base_spec(load: O.LoadOptions, output: O.OutputOptions, endpoint: O.EndpointFlags,
              engine_opts: EngineArgs):
    """The RunSpec every probe shares; each probe sets its rate and request count (and, with
    --workers or --ray, is a multi-worker run: the probe's schedule dealt to the workers)."""
    from cbbench.bench.runner import RunSpec

    if load.arrival not in PROBE_ARRIVALS:
        raise UsageError(f"unknown arrival process {load.arrival!r}: use "
                         f"{', '.join(PROBE_ARRIVALS)}")
    # The output group's --slo is the sweep's attainment SLO (the probes judge it), not a
    # run's goodput limits: the label and the telemetry pass to the probes.
    probes_output = O.OutputOptions(label=output.label, gpu_metrics=output.gpu_metrics,
                                    telemetry_interval=output.telemetry_interval)
    return RunSpec.from_options(load, engine_opts, probes_output, endpoint)


def point_prep(probe: O.ProbeOptions):
    """The per-point preparation the probe flags ask for (bench/point_prep.py)."""
    from cbbench.bench.point_prep import PointPrep

    return PointPrep(probe.reuse_prompts, probe.reset_prefix_cache, not probe.skip_warmup)


def probes_context(load):
    """Around every probe: with --ray, one Ray instance for them all (ray_pool.shared_ray)."""
    if not load.ray:
        return contextlib.nullcontext()
    from cbbench.distributed.ray_pool import shared_ray

    return shared_ray(load)
