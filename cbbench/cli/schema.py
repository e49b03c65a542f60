"""`cbbench schema run|sweep|capacity`: the JSON Schema of a result file (cbbench/schema/)."""

from __future__ import annotations

from typing import Annotated

import typer

from cbbench.errors import UsageError

KINDS = ("run", "sweep", "capacity", "forward")


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)


def schema(
    kind: Annotated[str, typer.Argument(help="run | sweep | capacity | forward.",
                                        metavar="KIND")],
) -> None:
    """Print the JSON Schema of a result file: run (a run's result), sweep (sweep.json),
    capacity (capacity.json) or forward (cbbench forward's file).

    Every reader (compare, gate, report, calibrate, run --replay) validates its files against
    these models; fields a model does not name are allowed, the named ones are typed.
    """
    from cbbench.schema import json_schema

    if kind not in KINDS:
        raise UsageError(f"unknown schema {kind!r}: use {', '.join(KINDS)}")
    typer.echo(json_schema(kind))
