"""A result's records as tables: CSV (per request, plus a summary CSV) and Parquet (per
request and per iteration), the formats AIPerf and GuideLLM export for notebooks.

Values are written so that they read back exactly: floats as Python's shortest round-trip
text in CSV and as float64 in Parquet; a list (a request's ITL with --save-detailed) is a
Parquet list column and JSON text in CSV; a nested object is JSON text in both.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

SUMMARY_SUFFIX = "_summary"
ITERATIONS_SUFFIX = "_iterations"
# The summary's distribution objects (ttft_ms, ...) are recognised by these keys.
DISTRIBUTION_KEYS = frozenset(("mean", "std", "count"))


def sibling(path: Path, suffix: str) -> Path:
    """requests.csv -> requests_summary.csv: the second file of an export, beside the first."""
    return path.with_name(f"{path.stem}{suffix}{path.suffix}")


def columns(rows: Iterable[Mapping]) -> list[str]:
    """Every key of the rows, in the order they first appear (records differ: an endpoint
    run's requests carry fields an engine run's lack)."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return list(seen)


def _csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return str(value)


def rows_csv(rows: Sequence[Mapping], header: Sequence[str] = ()) -> bytes:
    """``header``: the columns of a table with no row (a --summary-only result's requests),
    written alone: a file of one empty line is refused by pandas' and pyarrow's CSV readers."""
    cols = columns(rows) or list(header)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(cols)
    for row in rows:
        writer.writerow([_csv_cell(row.get(c)) for c in cols])
    return buf.getvalue().encode()


SUMMARY_COLUMNS = ("metric", "statistic", "value")


def summary_rows(summary: Mapping, prefix: str = "") -> list[dict]:
    """The summary in long form: one row per (metric, statistic); a distribution gives one
    row per statistic, a scalar the statistic "value", a nested object dotted metric names."""
    rows: list[dict] = []
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if value.keys() >= DISTRIBUTION_KEYS:
                rows += [
                    {"metric": name, "statistic": stat, "value": v}
                    for stat, v in value.items()
                    if not isinstance(v, (Mapping, list))
                ]
            else:
                rows += summary_rows(value, f"{name}.")
        else:  # a scalar or a list: one value
            rows.append({"metric": name, "statistic": "value", "value": value})
    return rows


def summary_csv(summary: Mapping) -> bytes:
    return rows_csv(summary_rows(summary), SUMMARY_COLUMNS)


def rows_parquet(rows: Sequence[Mapping]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = columns(rows)
    arrays = []
    fields = []
    for col in cols:
        values = [row.get(col) for row in rows]
        typ = _arrow_type(values)
        if typ == "json":
            values = [None if v is None else json.dumps(v, allow_nan=False) for v in values]
            typ = pa.string()
        elif typ == pa.float64():
            values = [None if v is None else float(v) for v in values]
        elif typ == pa.list_(pa.float64()):  # rows of ints and rows of floats: all floats
            values = [None if v is None else [float(x) for x in v] for v in values]
        arrays.append(pa.array(values, type=typ))
        fields.append(pa.field(col, typ))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _arrow_type(values: list):
    """One Arrow type for a column: ints stay int64 unless a float shares the column."""
    import pyarrow as pa

    kinds = {_kind(v) for v in values if v is not None}
    if not kinds:
        return pa.null()
    if kinds == {"bool"}:
        return pa.bool_()
    if kinds == {"int"}:
        return pa.int64()
    if kinds <= {"int", "float"}:
        return pa.float64()
    if kinds == {"str"}:
        return pa.string()
    if kinds <= {"list_int", "list_float"}:
        return pa.list_(pa.float64() if "list_float" in kinds else pa.int64())
    return "json"  # objects, or a column of mixed kinds: JSON text reads back whole


def _kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int" if _fits_int64(v) else "other"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list) and all(
        isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool) and _fits_int64(x))
        for x in v
    ):
        return "list_float" if any(isinstance(x, float) for x in v) else "list_int"
    return "other"  # an int beyond int64 too (alone or in a list): JSON text holds it whole


def _fits_int64(v: int) -> bool:
    return -(2**63) <= v < 2**63
