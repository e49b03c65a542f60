"""The result files as typed, versioned models (pydantic): the run result, sweep.json and
capacity.json. Every reader goes through :func:`read_run`, :func:`read_sweep` or
:func:`read_capacity`, so a tampered, truncated or older file is refused here, in one line;
`cbbench schema run|sweep|capacity|forward` prints the JSON Schema (forward: `cbbench forward`'s
file, read by :func:`read_forward`).

The readers return the models (RunResult, SweepFile, CapacityFile): code reads attributes
(``run.summary.ttft_ms``), and a model written by :func:`file_text` is the file byte for byte.

The models type every field they name and let other fields through (producers add fields; a
reader that does not know one keeps it), so the files' field names stay the producers'.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbbench.errors import UsageError
from cbbench.schema.base import (
    FileHeader,
    Record,
    dumps,
    file_text,
    from_built,
    to_dict,
    validate,
)
from cbbench.schema.run import RUN_SCHEMA_VERSION, RunResult

if TYPE_CHECKING:
    from cbbench.schema.capacity import CAPACITY_KIND, CAPACITY_SCHEMA_VERSION, CapacityFile
    from cbbench.schema.forward import FORWARD_KIND, FORWARD_SCHEMA_VERSION, ForwardResult
    from cbbench.schema.sweep import SWEEP_KIND, SWEEP_SCHEMA_VERSION, SweepFile

    MODELS: dict[str, type[Record]]

# The sweep, capacity and forward models load on first use (module __getattr__ below): a run
# reads and writes only the run model, and every `cbbench run` would otherwise build their
# classes too (~20 ms of CPU a start).
_LAZY = {
    "CAPACITY_KIND": "capacity", "CAPACITY_SCHEMA_VERSION": "capacity", "CapacityFile": "capacity",
    "FORWARD_KIND": "forward", "FORWARD_SCHEMA_VERSION": "forward", "ForwardResult": "forward",
    "SWEEP_KIND": "sweep", "SWEEP_SCHEMA_VERSION": "sweep", "SweepFile": "sweep",
}


def _models() -> dict[str, type[Record]]:
    """Each file kind's model (``MODELS``)."""
    from cbbench.schema.capacity import CapacityFile
    from cbbench.schema.forward import ForwardResult
    from cbbench.schema.sweep import SweepFile

    return {"run": RunResult, "sweep": SweepFile, "capacity": CapacityFile,
            "forward": ForwardResult}


def __getattr__(name: str) -> Any:
    if name == "MODELS":
        value: Any = _models()
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


__all__ = [
    "CAPACITY_KIND", "CAPACITY_SCHEMA_VERSION", "MODELS", "RUN_SCHEMA_VERSION", "SWEEP_KIND",
    "SWEEP_SCHEMA_VERSION", "CapacityFile", "RunResult", "SweepFile",
    "json_schema", "read_capacity", "read_json_file", "read_run", "read_sweep", "to_dict",
    "FORWARD_KIND", "FORWARD_SCHEMA_VERSION", "ForwardResult", "read_forward",
    "Record", "dumps", "file_text", "from_built", "as_run", "as_run_result", "parse_run",
]


# The dialect pydantic's schemas are written in (their $defs), named in the schema: a
# validator given none falls back to a draft of its own choosing.
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(kind: str) -> str:
    """``kind``'s JSON Schema. Its "integer" fields take 3.0 where the reader (strict) wants 3:
    JSON Schema's data model has no difference between the two, so no keyword can refuse it."""
    schema = {"$schema": JSON_SCHEMA_DIALECT, **_models()[kind].model_json_schema()}
    return json.dumps(schema, indent=2)


def read_json_file(path: Path, what: str = "result file") -> Any:
    """A JSON file's value; UsageError (one line) for anything Python's parser chokes on, an
    endless stream or a file beyond memory (engine/json_file.py says which)."""
    from cbbench.engine.json_file import read_json

    return read_json(path, what)


_NAMED_FILES = 3  # the point files the message names (of any number)


def _other_kind_message(data: dict, kind: object, path: object) -> str | None:
    """What ``data`` is when it is another of cbbench's files (a sweep, capacity or forward
    file), and the run results it was made of: handed to a reader of run results (compare,
    gate, export), one said "is missing its 'summary' section". None for any other kind."""
    from cbbench.schema.capacity import CAPACITY_KIND
    from cbbench.schema.forward import FORWARD_KIND
    from cbbench.schema.sweep import SWEEP_KIND

    known = {SWEEP_KIND: ("a sweep file", "points", "rate-*.json"),
             CAPACITY_KIND: ("a capacity file", "probes", "probe-*-rate-*.json"),
             FORWARD_KIND: ("a forward-pass benchmark file", None, None)}
    if not isinstance(kind, str) or kind not in known:
        return None
    what, key, pattern = known[kind]
    line = f"{path} is {what} (kind {kind!r}), not a run result"
    if key is None:
        return line
    points = data.get(key)
    names = [p["file"] for p in points if isinstance(p, dict) and isinstance(p.get("file"), str)
             ] if isinstance(points, list) else []
    shown = ", ".join(names[:_NAMED_FILES]) + (", ..." if len(names) > _NAMED_FILES else "")
    return (f"{line}: give the per-rate results it was made of, the {pattern} files in its "
            "folder" + (f" ({shown})" if shown else ""))


def _checked_run_dict(data: Any, path: object) -> dict:
    """The version and sections of a run result, before the model reads it (their own
    messages)."""
    header = FileHeader.model_validate(data) if isinstance(data, dict) else None
    if header is not None and (other := _other_kind_message(data, header.kind, path)):
        raise UsageError(other)
    if header is None or "schema_version" not in header.model_fields_set:
        raise UsageError(f"{path} is not a cbbench result (no schema_version)")
    version = header.schema_version
    # An int, not a bool or a float: true == 1 and 1.0 == 1 in Python, not in the schema.
    if type(version) is not int or version != RUN_SCHEMA_VERSION:
        raise UsageError(f"{path} has schema_version {version!r}; this cbbench reads version "
                         f"{RUN_SCHEMA_VERSION}")
    for key in ("config", "summary"):
        if not isinstance(data.get(key), dict):
            raise UsageError(f"{path} is missing its {key!r} section")
    return data


def parse_run(data: Any, path: object) -> RunResult:
    """A run result's JSON value as the RunResult model (one UsageError line if it is not)."""
    return validate(RunResult, _checked_run_dict(data, path), path, "cbbench result")


def as_run_result(data: dict, what: str = "the run's result") -> RunResult:
    """A result built in memory (bench/runner.py) as the model, holding exactly what its file
    will: its JSON value (NaN and inf as null, tuples as lists) validated, keys in the order
    the producer gave them."""
    return from_built(RunResult, data, what)


def as_run(result: RunResult | dict, path: object) -> RunResult:
    """A result as its model: a model as it is, a dict (a test's, an importer's) validated."""
    return result if isinstance(result, RunResult) else parse_run(result, path)


def read_run(path: Path) -> RunResult:
    """A run result file as its model, validated: readers use its attributes."""
    return parse_run(read_json_file(Path(path)), path)


def _read_kind(path: Path, kind: str, version: int, what: str) -> dict:
    data = read_json_file(Path(path), what)
    header = FileHeader.model_validate(data) if isinstance(data, dict) else None
    if header is None or header.kind != kind:
        raise UsageError(f"{path} is not a cbbench {what.split()[0]} (no kind {kind!r})")
    found = header.schema_version
    if found != version or type(found) is not int:
        raise UsageError(f"{path} has {what.split()[0]} schema_version "
                         f"{found!r}; this cbbench reads version {version}")
    return data


def read_sweep(path: Path) -> SweepFile:
    """sweep.json as its model, validated."""
    from cbbench.schema.sweep import SWEEP_KIND, SWEEP_SCHEMA_VERSION, SweepFile

    what = "sweep file"
    data = _read_kind(path, SWEEP_KIND, SWEEP_SCHEMA_VERSION, what)
    return validate(SweepFile, data, path, what)


def read_capacity(path: Path) -> CapacityFile:
    """capacity.json as its model, validated."""
    from cbbench.schema.capacity import CAPACITY_KIND, CAPACITY_SCHEMA_VERSION, CapacityFile

    what = "capacity file"
    data = _read_kind(path, CAPACITY_KIND, CAPACITY_SCHEMA_VERSION, what)
    return validate(CapacityFile, data, path, what)


def read_forward(path: Path) -> dict:
    from cbbench.schema.forward import FORWARD_KIND, FORWARD_SCHEMA_VERSION, ForwardResult

    what = "forward file"
    data = _read_kind(path, FORWARD_KIND, FORWARD_SCHEMA_VERSION, what)
    validate(ForwardResult, data, path, what)
    return data
