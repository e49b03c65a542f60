"""`cbbench export`: a result in the formats other tools read.

  br0.2    llm-d's Benchmark Report v0.2 (JSON), the envelope llm-d's analysis reads
  csv      one row per request in PATH, the summary in long form in PATH_summary.csv
  parquet  one row per request in PATH, one per engine iteration in PATH_iterations.parquet

Every file is written atomically; none replaces the result it was made from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cbbench.cli import options as C
from cbbench.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(
    result: Annotated[Path, typer.Argument(help="A cbbench result JSON.", metavar="RESULT.json")],
    fmt: Annotated[
        str,
        typer.Option("--format", help="br0.2 (llm-d Benchmark Report v0.2) | csv | parquet."),
    ] = "br0.2",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", parser=C.output_file, metavar="<path>",
            help="Output file. csv also writes PATH_summary.csv, parquet PATH_iterations"
            ".parquet beside it. Default: RESULT with the format's extension.",
        ),
    ] = None,
) -> None:
    """Write a result as llm-d's Benchmark Report v0.2, CSV or Parquet."""
    # Here, not at the top: `cbbench --help` registers every command (cli/app.py), and these
    # bring numpy and the result models.
    from cbbench.analysis.input_file import check_input_file
    from cbbench.analysis.result import check_not_an_input, write_atomic_group
    from cbbench.export.files import FORMATS, default_out, render
    from cbbench.schema import read_run

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    check_input_file(result, "result file")  # a FIFO with no writer hung export until killed
    data = read_run(result)
    out = out if out is not None else default_out(result, fmt)
    files = render(data, fmt, out)
    for path in files:
        check_not_an_input(path, [result], "--out")
    write_atomic_group(files)  # a main file never without its sidecar (a full disk)
    for path in files:
        typer.echo(f"wrote {path}")
