"""The files one export writes (`cbbench export`, and `run --output-format` beside its
result): each format's file names and bytes, so both write the same files the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cbbench.errors import UsageError
from cbbench.export import tabular
from cbbench.export.br02 import to_br02
from cbbench.export.writable import clean
from cbbench.schema.base import to_dict
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Request, RunResult

FORMATS = ("br0.2", "csv", "parquet")
EXTENSIONS = {"br0.2": ".br0.2.json", "csv": ".csv", "parquet": ".parquet"}


def default_out(result: Path, fmt: str) -> Path:
    """RESULT.json -> RESULT.br0.2.json, RESULT.csv, RESULT.parquet."""
    return result.with_name(result.stem + EXTENSIONS[fmt])


def paths(out: Path, fmt: str) -> list[Path]:
    """Every file an export to ``out`` writes: the file itself and, for the tables, its
    sibling (the summary CSV, the iterations Parquet)."""
    suffix = {"csv": tabular.SUMMARY_SUFFIX, "parquet": tabular.ITERATIONS_SUFFIX}.get(fmt)
    return [out] if suffix is None else [out, tabular.sibling(out, suffix)]


def render(result: RunResult | Mapping[str, Any], fmt: str, out: Path) -> dict[Path, bytes]:
    """Every file of the export, by path (csv and parquet write a sibling too). ``result``: a
    run result's model, or its dict (validated here)."""
    run = as_run(result)
    if fmt == "br0.2":  # reads the result's model, and cleans what it writes
        return {out: (json.dumps(to_br02(run), indent=1, allow_nan=False) + "\n").encode()}
    # The tables take the records as the file holds them, cleaned.
    requests = [clean(to_dict(r)) for r in run.requests or []]
    if fmt == "csv":
        return {
            out: tabular.rows_csv(requests, tuple(Request.model_fields)),
            tabular.sibling(out, tabular.SUMMARY_SUFFIX):
                tabular.summary_csv(clean(to_dict(run.summary))),
        }
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise UsageError("--format parquet needs pyarrow: pip install pyarrow") from None
    return {
        out: tabular.rows_parquet(requests),
        tabular.sibling(out, tabular.ITERATIONS_SUFFIX):
            tabular.rows_parquet([clean(to_dict(it)) for it in run.iterations or []]),
    }
