"""The JSONL reader every line-based workload format shares (JSONL workloads, Mooncake traces, the
CSV traces' line reader): lines end at \n only, each capped, errors name the line."""

from __future__ import annotations

import json
from pathlib import Path

from cbbench.errors import UsageError
from cbbench.finite import is_finite

# A JSONL line may be this long (a long session's turns, a 128k-token prompt, fit many times);
# a longer one (`--workload /dev/zero`) is an error, not a read until memory runs out.
MAX_LINE_BYTES = 64 << 20


def jsonl_lines(path: Path):
    """(line number, text) of each line: lines end at \n only (and \r\n), as JSONL says:
    str.splitlines() also cut at U+2028, U+2029 and U+0085, which JSON strings may hold.
    Read as a stream, each line at most MAX_LINE_BYTES."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; open errors are reported apart)
    except FileNotFoundError:
        raise UsageError(f"workload file not found: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read workload file {path}: {e}") from None
    with f:
        lineno = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                raise UsageError(f"cannot read workload file {path}: {e}") from None
            if not raw:
                return
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(
                    f"{path}:{lineno}: the line is longer than {MAX_LINE_BYTES >> 20} MiB"
                )
            try:
                yield lineno, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise UsageError(f"cannot read workload file {path}: line {lineno}: {e}") from None


def jsonl_objects(path: Path):
    """(where, value) of each non-blank line of a JSONL file, ``where`` being ``PATH:LINE``;
    a line that is not JSON is one UsageError naming it."""
    for lineno, line in jsonl_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise UsageError(f"{where}: the JSON is nested too deeply") from None
        except ValueError as e:  # an integer of more digits than int() takes
            raise UsageError(f"{where}: malformed JSON ({e})") from None
        yield where, obj


# ---- a line's fields, checked as every JSONL format words it ------------------------------
# A count, length or priority is a 64-bit integer: the summary holds each request's in an
# int64 column, so a larger one (valid JSON) failed only after the run, losing its result.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def check_int64(v: int, key: str, where: str) -> int:
    if not INT64_MIN <= v <= INT64_MAX:
        raise UsageError(f"{where}: {key!r} must be a 64-bit integer "
                         f"(within [{INT64_MIN}, {INT64_MAX}]), got {v}")
    return v


def json_object(obj: object, allowed: set[str], where: str, what: str = "") -> dict:
    """``obj`` as an object of the format's fields: anything else, or a field the format does
    not define, is refused naming the ones it does (``what``: "turn ", "session ")."""
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - allowed
    if unknown:
        raise UsageError(f"{where}: unknown {what}field(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {', '.join(sorted(allowed))}")
    return obj


def json_int(obj: dict, key: str, where: str, minimum: int) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UsageError(f"{where}: {key!r} must be an integer >= {minimum}")
    return check_int64(v, key, where)


def json_number(obj: dict, key: str, where: str) -> float:
    """A finite number >= 0 (a time)."""
    v = obj[key]
    if not is_finite(v) or v < 0:
        raise UsageError(f"{where}: {key!r} must be a finite number >= 0")
    return float(v)


def json_ids(obj: dict, key: str, where: str) -> tuple[int, ...]:
    """A non-empty list of token ids."""
    raw = obj[key]
    if not isinstance(raw, list) or not raw or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw
    ):
        raise UsageError(f"{where}: {key!r} must be a non-empty list of ids >= 0")
    return tuple(raw)
