"""The one place bad input becomes `cbbench: error: ...` and exit code 2.

Input is read (and refused, with UsageError) where it is parsed: a flag's parser, an option
group's ``validate()``, a file's schema. The command and group classes of the CLI mix this in:
the root group's ``invoke`` wraps parsing and running of every subcommand, so no command
carries its own translation; a command's ``invoke`` first refuses nan and infinities for
every float flag (the ones that take inf, the request rates, are text)."""

from __future__ import annotations

import math

import typer

from cbbench.engine.args import flag_of
from cbbench.errors import UsageError

USAGE_EXIT = 2


def usage_exit(e: UsageError) -> typer.Exit:
    typer.echo(f"cbbench: error: {e}", err=True)
    return typer.Exit(USAGE_EXIT)


def check_finite(values: dict) -> None:
    for name, v in values.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(f"{flag_of(name)} must be a finite number, got {v}")


class GroupBoundary:
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as e:
            raise usage_exit(e) from None


class CommandBoundary:
    def invoke(self, ctx):
        try:
            check_finite(ctx.params)
            return super().invoke(ctx)
        except UsageError as e:
            raise usage_exit(e) from None
