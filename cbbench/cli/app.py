"""The `cbbench` command line (Typer)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cbbench import __version__
from cbbench.cli import logs
from cbbench.cli.help import TidyGroup, tidy_commands

app = typer.Typer(
    name="cbbench",
    help="Benchmark LLM serving: TTFT/TPOT/ITL distributions, throughput, and the engine's "
    "per-iteration story, against the bundled engine or any OpenAI-compatible endpoint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=TidyGroup,
)
workloads_app = typer.Typer(
    help="List and inspect workloads.", no_args_is_help=True, cls=TidyGroup
)
app.add_typer(workloads_app, name="workloads")


INTERRUPTED_EXIT = 130
logs.install()  # the library's notices print as `cbbench: ...` lines


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
from cbbench.cli import (  # noqa: E402
    audit,
    calibrate,
    capacity,
    compare,
    export,
    forward,
    gate,
    import_result,
    report,
    run,
    schema,
    serve,
    sweep,
    workloads,
)

for command in (run, compare, gate, report, serve, sweep, capacity, calibrate, export,
                import_result, audit, schema, forward):
    command.register(app)
workloads.register(workloads_app)
# Every command's help reflowed and its switches without a type (cbbench/cli/help.py).
tidy_commands(app)
tidy_commands(workloads_app)


def main() -> None:
    code = _invoke()
    sys.exit(code)


def _invoke() -> int:
    """Run the app; every failure becomes one line on stderr and an exit code."""
    try:
        rv = app(standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        # A second Ctrl-C: leave now. Result files are replaced atomically, so none is partial.
        typer.echo("cbbench: interrupted", err=True)
        return INTERRUPTED_EXIT
    except Exception as e:
        # Click's parse errors (bad option, bad value, missing argument) carry an exit code and
        # a message; print that one line instead of click's usage block.
        if hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int):
            message = e.format_message()
            if message:
                typer.echo(f"cbbench: error: {message}", err=True)
            else:  # no arguments at all: show the help
                typer.echo(e.ctx.get_help() if getattr(e, "ctx", None) else "", err=True)
            return e.exit_code
        raise
    if rv == INTERRUPTED_EXIT:  # typer's own handling of a KeyboardInterrupt
        typer.echo("cbbench: interrupted", err=True)
    return rv if isinstance(rv, int) else 0
