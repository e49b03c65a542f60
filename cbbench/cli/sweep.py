"""`cbbench sweep`: one workload at several request rates, with the latency-throughput curve."""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
from pathlib import Path
from typing import Annotated

import typer

from cbbench.cli import options as C
from cbbench.errors import UsageError
from cbbench.load.interrupts import StopSignal

DEFAULT_OUT_PARENT = Path("results") / "runs"  # git ignores it: sweeps are scratch
MAX_POINTS = 100  # each point is a whole run: more is a typo (10^9 points ran out of memory)

# Options that sweep and capacity share (the engine ones come from cli_common).
Workload = Annotated[str, typer.Option(help="Built-in workload (sharegpt, long-prompt) or a JSONL file.")]
NumRequests = Annotated[
    int,
    typer.Option(
        help="Requests per probe at the least (more at high rates: see --min-duration), and "
        "the size of a rate-inf probe."
    ),
]
MinDuration = Annotated[
    float,
    typer.Option(
        help="Seconds of arrivals each probe should span: it sends max(--num-requests, "
        "rate x this) requests, so queues can settle into a steady state."
    ),
]
MaxRequests = Annotated[int, typer.Option(help="The most requests one probe sends.")]
Seed = Annotated[int, typer.Option(help="Seed for requests, arrivals and sampling (all probes).")]
Burstiness = Annotated[
    float, typer.Option(help="Gamma shape of inter-arrival times: 1 = Poisson, <1 burstier.")
]
Arrival = Annotated[str, typer.Option(help="gamma (with --burstiness) | constant.")]
ARRIVALS = ("gamma", "constant")
Workers = Annotated[
    str,
    typer.Option(help="Client processes that send each probe's schedule (--endpoint runs): N, "
                 "or auto (one per spare core), as in `cbbench run`."),
]
Ray = Annotated[
    bool,
    typer.Option("--ray", help="Run each probe's workers as Ray actors (pip install "
                 "'cbbench[ray]'): one Ray instance for every probe, local unless "
                 "--ray-address is given."),
]
RayAddress = Annotated[str | None, typer.Option(help="Join this running Ray cluster (with --ray).")]
# Endpoint options come from cli_common, as `cbbench run` names them (open loop only: no
# --max-concurrency, which would cap the very load a rate sweep offers).


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)


@C.guard
@C.with_engine_options
def sweep(
    rates: Annotated[
        str,
        typer.Option(
            help="Comma-separated request rates (inf: all at t=0), or auto: a rate-inf probe "
            "measures saturation, then --points rates from 10% to 95% of it."
        ),
    ] = "auto",
    points: Annotated[int, typer.Option(help="--rates auto: how many rates.")] = 6,
    workload: Workload = "sharegpt",
    num_requests: NumRequests = 1000,
    min_duration: MinDuration = 60.0,
    max_requests: MaxRequests = 10_000,
    seed: Seed = 0,
    burstiness: Burstiness = 1.0,
    arrival: Arrival = "gamma",
    slo: Annotated[
        str | None,
        typer.Option(help="SLO in ms for goodput and attainment, e.g. ttft_p99=1000,tpot_p99=50."),
    ] = None,
    attainment: Annotated[
        float | None, typer.Option(help="Attainment target (default: the SLO's percentile).")
    ] = None,
    endpoint: C.Endpoint = None,
    api: C.Api = "completions",
    served_model: C.ServedModel = None,
    ignore_eos_field: C.IgnoreEosField = True,
    header: C.Header = None,
    request_timeout: C.RequestTimeout = 600.0,
    tokenizer: C.Tokenizer = None,
    workers: Workers = "1",
    ray: Ray = False,
    ray_address: RayAddress = None,
    label: Annotated[str | None, typer.Option(help="A name for this sweep's runs.")] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(help="Folder for rate-<r>.json, sweep.json and the plot. "
                     "Default: results/runs/sweep-<time>."),
    ] = None,
    *,
    engine_opts: C.EngineArgs,
) -> None:
    """Run one workload at several request rates: latency against throughput.

    The same requests at every rate, on a fresh engine per point. Prints latency percentiles,
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
    from cbbench.analysis.slo import parse_attainment_slo
    from cbbench.bench.probe import ProbeSizing
    from cbbench.bench.sweep import (
        PLOT_FILE,
        SWEEP_FILE,
        parse_rates,
        points_of,
        run_sweep,
        sweep_table,
        unsteady_notes,
    )
    from cbbench.report.sweep_plot import latency_throughput, png_bytes

    rate_list = parse_rates(rates)
    if rate_list is None and not 1 <= points <= MAX_POINTS:
        raise UsageError(f"--points must be in [1, {MAX_POINTS}], got {points}")
    slo_spec = parse_attainment_slo(slo, attainment)
    sizing = ProbeSizing(num_requests, min_duration, max_requests)
    for r in rate_list or []:
        sizing.check_schedule(r)
    base = base_spec(
        workload, seed, burstiness, arrival, label,
        engine_opts,
        C.endpoint_options(
            endpoint, api, served_model, ignore_eos_field, header, request_timeout, tokenizer, seed
        ),
        workers, ray, ray_address,
    )
    folder = out_dir or DEFAULT_OUT_PARENT / _dt.datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out-dir {folder} is a file; give a folder")
    check_writable(folder / SWEEP_FILE)
    check_folder_not_inputs(folder, [SWEEP_FILE, PLOT_FILE, "rate-*.json"],
                            [workload, tokenizer, *engine_inputs(engine_opts)], "--out-dir")

    with StopSignal() as stop, probes_context(base.load):
        result = run_sweep(base, rate_list, points, sizing, slo_spec, folder, C.notice, stop)
    pts = points_of(result)
    write_atomic(folder / PLOT_FILE, png_bytes(latency_throughput([(folder.name, result)])))
    if result["saturation_rate"] is not None:
        typer.echo(f"saturation (rate inf): ~{result['saturation_rate']:.4g} req/s")
    if slo_spec is not None:
        typer.echo(f"SLO: {slo_spec.describe()}")
    typer.echo("latencies in ms")
    typer.echo(sweep_table(pts))
    for note in unsteady_notes(pts):
        typer.echo(f"note: {note}")
    if result["interrupted"]:
        typer.echo(f"interrupted: the sweep stopped after {len(pts)} point(s); the last one "
                   "covers only what finished")
    typer.echo(f"\nsweep: {folder / SWEEP_FILE}\nplot: {folder / PLOT_FILE}")


def base_spec(workload, seed, burstiness, arrival, label, engine_opts, endpoint_opts,
              workers="1", ray=False, ray_address=None):
    """The RunSpec every probe shares; each probe sets its rate and request count (and, with
    --workers or --ray, is a multi-worker run: the probe's schedule dealt to the workers)."""
    from cbbench.bench.runner import RunSpec
    from cbbench.distributed.plan import LoadPlan, parse_workers

    load = LoadPlan(parse_workers(workers), ray, ray_address).validate()
    if endpoint_opts is None and load.distributed:
        raise UsageError("--workers and --ray apply to --endpoint runs")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise UsageError(f"--burstiness must be a positive number, got {burstiness}")
    if arrival not in ARRIVALS:
        raise UsageError(f"unknown arrival process {arrival!r}: use {', '.join(ARRIVALS)}")
    return RunSpec(
        workload=workload, seed=seed, burstiness=burstiness, arrival=arrival, label=label,
        engine=engine_opts, endpoint=endpoint_opts, load=load,
    )


def probes_context(load):
    """Around every probe: with --ray, one Ray instance for them all (ray_pool.shared_ray)."""
    if not load.ray:
        return contextlib.nullcontext()
    from cbbench.distributed.ray_pool import shared_ray

    return shared_ray(load)
