"""`cbbench calibrate`: fit the simulator's device rates to real runs, write a device profile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from tabulate import tabulate

from cbbench.cli import options as C

if TYPE_CHECKING:  # `cbbench --help` imports this module: pydantic only when the command runs
    from cbbench.schema.profile import CalibrationProfile
    from cbbench.schema.run import RunResult

UNITS = {
    "memory_bandwidth": (1e9, "GB/s"),
    "flop_rate": (1e9, "GFLOP/s"),
    "decode_attention_efficiency": (1.0, ""),
    "prefill_attention_efficiency": (1.0, ""),
    "iteration_overhead_s": (1e-6, "µs"),
    "row_overhead_s": (1e-6, "µs"),
    "prefill_overhead_s": (1e-6, "µs"),
    "host_factor": (1.0, "x"),
}


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)


def calibrate(
    results: Annotated[
        list[Path], typer.Argument(
            help="Result JSON files of real runs (--engine torch) on one device (.json or "
                 ".json.gz), and/or the GPU check's decode microbenchmark (decode.json).")
    ],
    out: Annotated[
        Path,
        typer.Option("--out", help="Where to write the device profile (JSON).",
                     parser=C.output_file, metavar="<path>"),
    ],
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the profile JSON instead of the tables.")
    ] = False,
) -> None:
    """Fit the roofline's device rates (memory bandwidth, FLOP rate, attention efficiency,
    overheads per iteration and per request row) to the iteration records of real runs, by
    robust least squares; parameters the data cannot determine are reported, not invented.

    Use the profile with --gpu-profile: `cbbench run --engine sim --gpu-profile PROFILE.json`
    simulates the calibrated device; a real run on that device with --gpu-profile reports the
    simulator's error (summary.engine.sim_error)."""
    from cbbench.analysis.calibration import calibrate as fit
    from cbbench.analysis.calibration_inputs import read_input
    from cbbench.analysis.input_file import check_input_file
    from cbbench.analysis.result import (
        check_not_an_input,
        check_writable,
        dumps,
        write_atomic,
    )

    for p in results:  # a FIFO with no writer hung calibrate until killed
        check_input_file(p, "calibration input")
    check_writable(out)
    check_not_an_input(out, results, "--out")
    runs: list[tuple[str, RunResult]] = []
    benches: list[tuple[str, dict]] = []
    for p in results:
        _, data = read_input(p)
        if isinstance(data, dict):  # a decode microbenchmark
            benches.append((str(p), data))
        else:
            runs.append((str(p), data))
    profile = fit(runs, benches)
    write_atomic(out, dumps(profile) + "\n")
    if json_out:
        typer.echo(dumps(profile))
        return
    from cbbench.schema.base import validate
    from cbbench.schema.profile import CalibrationProfile

    # The written profile's model: the tables read it by attribute.
    model = validate(CalibrationProfile, profile, out, "device profile")
    typer.echo(render(model))
    for line in model.warnings or []:
        typer.echo(f"warning: {line}")
    typer.echo(f"\nprofile: {out}")


def render(profile: CalibrationProfile) -> str:
    head = (
        f"device {profile.device} ({profile.device_name}) · {profile.dtype} · "
        f"{', '.join(profile.models)} · {profile.num_iterations} iterations"
    )
    rows = []
    for name, p in profile.params.items():
        div, unit = UNITS[name]
        used = p.used
        value = "-" if used is None else f"{used / div:,.4g} {unit}".strip()
        rse = "-" if p.rse is None else f"{p.rse:.1%}"
        conf = p.confounded_with
        rows.append([name, value, p.status, rse, f"{p.median_share_of_time:.1%}",
                     "-" if conf is None else conf.param])
    params = tabulate(rows, headers=["parameter", "used", "status", "rel. std. error",
                                     "median share of time", "confounded with"])
    res = []
    for cls, r in profile.residuals.items():
        if r.n:
            res.append([cls, r.n, f"{r.median:.1%}", f"{r.p90:.1%}", f"{r.bias:+.1%}"])
        else:
            res.append([cls, 0, "-", "-", "-"])
    residuals = tabulate(res, headers=["fit residuals", "n", "median |err|", "p90 |err|", "bias"])
    determined = ("" if profile.determined is None
                  else f"determined by the data: {profile.determined}")
    return f"{head}\n\n{params}\n{determined}\n\n{residuals}"
