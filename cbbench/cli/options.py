"""Small pieces the CLI commands share: the notice line, output paths, and the engine options
built from values (the flags themselves come from the option groups in cbbench/options/)."""

from __future__ import annotations

import datetime as _dt
import logging
from pathlib import Path

from cbbench.cli.boundary import USAGE_EXIT
from cbbench.engine.args import EngineArgs, flag_of
from cbbench.options import output_file
from cbbench.options.fields import given

__all__ = ["USAGE_EXIT", "EngineArgs", "default_output_path", "flag_of", "given", "notice",
           "output_file"]


def notice(msg: str) -> None:
    """A command's own one-line notice: through the `cbbench` logger, as the library's are."""
    logging.getLogger("cbbench.cli").info(msg)


def default_output_path(kind: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"run-{stamp}-{kind}.json"
