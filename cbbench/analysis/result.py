"""The result file: versioned JSON, written atomically so a reader never sees half a file."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from cbbench import __version__
from cbbench.errors import UsageError

SCHEMA_VERSION = 1


def _clean(obj):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _dump(obj, indent: str) -> str:
    """Pretty at the top, one line per record: a 1000-request result stays readable and about
    half the size of fully indented JSON, and diffs line up record by record."""
    if isinstance(obj, dict) and obj and indent.count(" ") < 2:
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {_dump(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        inner = indent + " "
        rows = [inner + json.dumps(v, separators=(",", ":"), allow_nan=False) for v in obj]
        return "[\n" + ",\n".join(rows) + "\n" + indent + "]"
    return json.dumps(obj, allow_nan=False)


def dumps(result: dict) -> str:
    return _dump(_clean(result), "")


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (umask applies).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_result(path: Path, result: dict) -> None:
    write_atomic(path, dumps(result) + "\n")


def check_writable(path: Path) -> None:
    """Fail before the run, not after an hour of measuring."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create output folder {parent}: {e.strerror}") from None
    if path.is_dir():
        raise UsageError(f"output path {path} is a folder; give a file name")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".cbbench-probe.", dir=parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UsageError(f"cannot write to {parent}: {e.strerror}") from None


def load_result(path: Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"result file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read result file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise UsageError(f"{path} is not a cbbench result (no schema_version)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise UsageError(
            f"{path} has schema_version {data['schema_version']!r}; "
            f"this cbbench reads version {SCHEMA_VERSION}"
        )
    for key in ("config", "summary"):
        if not isinstance(data.get(key), dict):
            raise UsageError(f"{path} is missing its {key!r} section")
    return data


def base_result(config: dict) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "cbbench_version": __version__,
        "interrupted": False,
        "config": config,
    }
