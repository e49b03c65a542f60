"""`cbbench calibrate`: fit the simulator's device rates to real runs, write a device profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from tabulate import tabulate

from cbbench.cli import options as C

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
        list[Path], typer.Argument(help="Result JSON files of real runs (--engine torch) on one device.")
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
    from cbbench.analysis.result import (
        check_not_an_input,
        check_writable,
        dumps,
        load_result,
        write_atomic,
    )

    check_writable(out)
    check_not_an_input(out, results, "--out")
    loaded = [(str(p), load_result(p)) for p in results]
    profile = fit(loaded)
    write_atomic(out, dumps(profile) + "\n")
    if json_out:
        typer.echo(dumps(profile))
        return
    typer.echo(render(profile))
    typer.echo(f"\nprofile: {out}")


def render(profile: dict) -> str:
    head = (
        f"device {profile['device']} ({profile['device_name']}) · {profile['dtype']} · "
        f"{', '.join(profile['models'])} · {profile['num_iterations']} iterations"
    )
    rows = []
    for name, p in profile["params"].items():
        div, unit = UNITS[name]
        used = p["used"]
        value = "-" if used is None else f"{used / div:,.4g} {unit}".strip()
        rse = "-" if p["rse"] is None else f"{p['rse']:.1%}"
        rows.append([name, value, p["status"], rse, f"{p['median_share_of_time']:.1%}"])
    params = tabulate(rows, headers=["parameter", "used", "status", "rel. std. error",
                                     "median share of time"])
    res = []
    for cls, r in profile["residuals"].items():
        if r["n"]:
            res.append([cls, r["n"], f"{r['median']:.1%}", f"{r['p90']:.1%}", f"{r['bias']:+.1%}"])
        else:
            res.append([cls, 0, "-", "-", "-"])
    residuals = tabulate(res, headers=["fit residuals", "n", "median |err|", "p90 |err|", "bias"])
    return f"{head}\n\n{params}\n\n{residuals}"
