"""The `cbbench` command line (Typer)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from . import __version__
from .errors import UsageError

app = typer.Typer(
    name="cbbench",
    help="Benchmark LLM serving: TTFT/TPOT/ITL distributions, throughput, and the engine's "
    "per-iteration story, against the bundled engine or any OpenAI-compatible endpoint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
workloads_app = typer.Typer(help="List and inspect workloads.", no_args_is_help=True)
app.add_typer(workloads_app, name="workloads")

from .cli_common import USAGE_EXIT  # noqa: E402

INTERRUPTED_EXIT = 130


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cbbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    pass


# Each command lives in its own module and registers itself here.
from . import cmd_compare, cmd_gate, cmd_report, cmd_run, cmd_serve, cmd_workloads  # noqa: E402

cmd_run.register(app)
cmd_compare.register(app)
cmd_gate.register(app)
cmd_report.register(app)
cmd_serve.register(app)
cmd_workloads.register(workloads_app)


def main() -> None:
    try:
        app()
    except UsageError as e:  # a command without its own guard
        typer.echo(f"cbbench: error: {e}", err=True)
        sys.exit(USAGE_EXIT)
    except KeyboardInterrupt:  # a second Ctrl-C: results on disk are whole (atomic replace)
        typer.echo("cbbench: interrupted", err=True)
        sys.exit(INTERRUPTED_EXIT)
