"""Small pieces the CLI commands share: the notice line, output paths, and the engine options
built from values (the flags themselves come from the option groups in cbbench/options/)."""

from __future__ import annotations

import datetime as _dt
import logging
from pathlib import Path

from cbbench.cli.boundary import USAGE_EXIT
from cbbench.engine.args import EngineArgs, flag_of
from cbbench.options import output_file

__all__ = ["USAGE_EXIT", "EngineArgs", "default_output_path", "engine_args", "flag_of", "given", "notice",
           "output_file"]


def notice(msg: str) -> None:
    """A command's own one-line notice: through the `cbbench` logger, as the library's are."""
    logging.getLogger("cbbench.cli").info(msg)


def given(name: str) -> bool:
    """Whether the running command's option ``name`` was given (on the command line or the
    environment), not left at its default: a default cannot say so by its value."""
    try:  # Typer 0.2x runs commands on its own copy of Click
        from typer._click.globals import get_current_context
    except ImportError:  # the same function from Click itself (a different module to mypy)
        from click import get_current_context  # type: ignore[no-redef]

    ctx = get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def default_output_path(kind: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"run-{stamp}-{kind}.json"


def engine_args(**values) -> EngineArgs:
    """EngineArgs from option values, checked (UsageError naming the option)."""
    return EngineArgs(**values).validate()
