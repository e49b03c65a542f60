"""`cbbench compare`: results side by side, with ratios against the first.

Two modes: existing result files, or `--variants`, which runs each engine variant on the
identical request set (same workload, seed and arrivals) and saves DIR/<variant>.json. The table
lives in cbbench/analysis/comparison/compare.py (shared with `cbbench report`), the variants in
cbbench/bench/variants.py.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cbbench import options as O
from cbbench.cli import options as C
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.interrupts import StopSignal

if TYPE_CHECKING:
    from cbbench.bench.runner import RunSpec

# Inside results/runs/, which git ignores: variant runs are scratch, not baselines.
DEFAULT_OUT_PARENT = Path("results") / "runs"


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)


@O.with_options(
    O.Group(O.LoadOptions, "load", help_prefix="--variants: ", only=(
        "workload", "num_requests", "seed", "request_rate", "burstiness", "arrival"),
        help={"workload": O.FIXED_LENGTHS_WORKLOAD_HELP}),
    O.Group(O.OutputOptions, "output", help_prefix="--variants: ", only=("slo", "save_detailed")),
    O.Group(O.OutputOptions, "shown", **O.READ_OUTPUT, help={
        "percentiles": "Latency rows at these percentiles, e.g. 50,99.9 (computed from a "
        "result's requests where it did not store them). Default: mean, p50, p99."}),
    O.engine_group(),
    O.Group(O.WindowOptions, "windowed", help={"window": "all: the whole run's figures; steady: "
            "each result's steady-state window (ramp-up and drain left out)."}),
)
def compare(
    files: Annotated[
        list[Path] | None, typer.Argument(help="Result files; the first is the reference.")
    ] = None,
    variants: Annotated[
        str | None,
        typer.Option(
            help="Run these variants on one request set instead: static, continuous, "
            "continuous-chunked | paged, reserved | recompute, swap | fcfs, priority | "
            "prefix-cache, no-prefix-cache; combine axes with '+'."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(help="--variants: folder for <variant>.json. Default: results/runs/compare-<time>."),
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Also write the table as Markdown.", parser=C.output_file,
                                  metavar="<path>")
    ] = None,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Also write the numbers and ratios as CSV.",
                                  parser=C.output_file, metavar="<path>")
    ] = None,
    *,
    windowed: O.WindowOptions,
    load: O.LoadOptions,
    output: O.OutputOptions,
    shown: O.OutputOptions,
    engine_opts: EngineArgs,
) -> None:
    """Compare results side by side, or run engine variants on one request set.

    Result files: each metric with its ratio to the first file's, and the configs'
    differences. --variants: each variant runs on the identical request set (same workload,
    seed and arrivals) and is saved as DIR/<variant>.json. A variant sets any of the batching
    (static, continuous, continuous-chunked), the KV allocation (paged, reserved), the preemption
    mode (recompute, swap), the queue policy (fcfs, priority) and prefix caching (prefix-cache,
    no-prefix-cache), joined with '+'; the other engine options apply to every variant.
    """
    from cbbench.analysis.comparison.compare import (
        csv_text,
        load_labeled,
        markdown_text,
        render_differences,
        render_table,
        with_percentiles,
        workload_note,
    )
    from cbbench.analysis.comparison.windows import select_window
    from cbbench.analysis.input_file import check_input_file
    from cbbench.analysis.result import (
        check_distinct_outputs,
        check_not_an_input,
        check_writable,
        write_atomic_group,
    )
    from cbbench.bench.variants import parse_variants, run_variants, variant_paths
    from cbbench.schema import as_run

    window = windowed.window
    if variants is not None and files:
        raise UsageError("give result files or --variants, not both")
    for p in files or []:  # a FIFO with no writer hung in open()
        check_input_file(p, "result file")
    outputs = [("--markdown", markdown), ("--csv", csv_out)]
    if variants is not None:
        chosen = parse_variants(variants)
        folder = out_dir or DEFAULT_OUT_PARENT / _dt.datetime.now().strftime("compare-%Y%m%d-%H%M%S")
        check_distinct_outputs([*outputs, *((f"variant {v.name}'s result", p)
                                            for v, p in zip(chosen, variant_paths(chosen, folder)))])
    check_distinct_outputs(outputs)  # before check_writable, which makes missing folders
    for flag, path in outputs:
        if path is not None:
            check_writable(path)
            check_not_an_input(path, files or [], flag)
    if variants is not None:
        base = _base_spec(load, output, engine_opts)
        # run's interrupt contract: the first signal ends the variant in progress (saved,
        # marked interrupted) and starts no other; a second exits 130.
        with StopSignal() as stop:
            results = run_variants(chosen, base, folder, stop)
    else:
        if not files or len(files) < 2:
            raise UsageError("compare needs two or more result files (or --variants)")
        results = load_labeled(files)

    if window == "steady":
        results = [
            dataclasses.replace(x, result=as_run(select_window(x.result, window, x.label),
                                                 x.label))
            for x in results
        ]
    results, rows = with_percentiles(results, shown.percentiles_given())
    table, differences = render_table(results, rows=rows), render_differences(results)
    note = workload_note(results)
    # The files first, as gate writes them: a write that fails (a full disk) exits 2 with
    # nothing on stdout; the table was printed, then `cannot write /dev/full`. Both or
    # neither: a CSV that failed left the Markdown written.
    files_out: dict[Path, str] = {}
    if markdown is not None:
        files_out[markdown] = markdown_text(results, rows)
    if csv_out is not None:
        files_out[csv_out] = csv_text(results, rows)
    write_atomic_group(files_out)
    if window == "steady":
        typer.echo("window: steady state (summary.steady_state)")
    typer.echo(table)
    typer.echo("")
    typer.echo(differences)
    if note:
        typer.echo(f"\n{note}")


def _base_spec(load: O.LoadOptions, output: O.OutputOptions, opts: EngineArgs) -> RunSpec:
    """The RunSpec every variant shares; only its engine options change per variant. Without
    --num-requests the runner decides the count as for `cbbench run`: 1000 drawn from a
    built-in workload, a user's file replayed whole."""
    from cbbench.bench.runner import RunSpec

    return RunSpec.from_options(load, opts, output)
