"""`cbbench schema run|sweep|capacity`: the JSON Schema of a result file (cbbench/schema/)."""

from __future__ import annotations

import os
import sys
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
    text = json_schema(kind)
    try:
        typer.echo(text)
        sys.stdout.flush()
    except OSError as e:  # `> /dev/full`, a closed pipe: one line, not a traceback
        # What is left in stdout's buffer must not fail again at exit: send it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise UsageError(f"cannot write the schema to standard output: {e.strerror or e}") \
            from None
