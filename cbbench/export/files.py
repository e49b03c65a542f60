"""The files one export writes (`cbbench export`, and `run --output-format` beside its
result): each format's file names and bytes, so both write the same files the same way."""

from __future__ import annotations

import json
import math
from pathlib import Path

from cbbench.errors import UsageError
from cbbench.export import tabular
from cbbench.export.br02 import to_br02

FORMATS = ("br0.2", "csv", "parquet")
EXTENSIONS = {"br0.2": ".br0.2.json", "csv": ".csv", "parquet": ".parquet"}


def default_out(result: Path, fmt: str) -> Path:
    """RESULT.json -> RESULT.br0.2.json, RESULT.csv, RESULT.parquet."""
    return result.with_name(result.stem + EXTENSIONS[fmt])


def clean(value):
    """``value`` with what no export format can hold made writable: a lone surrogate (a
    result's JSON may carry "\\ud800", which no UTF-8 file can) as U+FFFD, and NaN or an
    infinity (BR0.2 is strict JSON) as null. Both were tracebacks."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def render(data: dict, fmt: str, out: Path) -> dict[Path, bytes]:
    """Every file of the export, by path (csv and parquet write a sibling too)."""
    data = clean(data)
    requests = data.get("requests") or []
    if fmt == "br0.2":
        return {out: (json.dumps(to_br02(data), indent=1, allow_nan=False) + "\n").encode()}
    if fmt == "csv":
        return {
            out: tabular.rows_csv(requests),
            tabular.sibling(out, tabular.SUMMARY_SUFFIX): tabular.summary_csv(data["summary"]),
        }
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise UsageError("--format parquet needs pyarrow: pip install pyarrow") from None
    return {
        out: tabular.rows_parquet(requests),
        tabular.sibling(out, tabular.ITERATIONS_SUFFIX):
            tabular.rows_parquet(data.get("iterations") or []),
    }
