"""Reading a JSON file a user names (a result, a sweep, a device profile, a model's config.json,
a tokenizer_config.json): whatever the path holds, a one-line InputError (the one bad-input
type, a ValueError), never a traceback or
the OOM killer. `gate /dev/zero` read until the OOM killer came; `--gpu-profile /dev/zero` gave a
MemoryError, a profile nested 100k brackets deep a RecursionError."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .errors import InputError
from .memory_check import available_host_bytes, fmt_bytes

# A pipe or a device (whose size is not known up front) is read up to this many bytes.
MAX_STREAM_BYTES = 1 << 30
# Memory json.loads needs per byte of the file, the bytes themselves included: measured 3.9x on
# a 3.5 MB simulated result (the decoded text, then floats and dicts); a round figure above it.
JSON_MEMORY_FACTOR = 5


def read_json(path: str | Path, what: str, max_bytes: int | None = None):
    """The value in the JSON file ``path``; InputError (one line naming it as ``what``) when it is
    missing, a folder, unreadable, larger than ``max_bytes`` (a pipe or a device: than
    MAX_STREAM_BYTES when None) or than memory allows, not UTF-8, not JSON, nested too deeply
    (RecursionError) or holding an integer beyond int()'s digit limit."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISREG(st.st_mode):
                _check_size(path, what, st.st_size, max_bytes)
                raw = f.read()
            else:  # a pipe or a device: its size shows only as it is read
                cap = MAX_STREAM_BYTES if max_bytes is None else max_bytes
                raw = f.read(cap + 1)
                _check_size(path, what, len(raw), cap)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {what} {path}: {e}") from None
    del raw
    try:
        return json.loads(text, parse_int=bounded_int)
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise InputError(f"{path} is not a {what}: its JSON is nested too deeply") from None
    except ValueError as e:  # an integer of more digits than int() takes
        raise InputError(f"{path} is not valid JSON ({e})") from None


def _check_size(path: Path, what: str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise InputError(f"{path} holds more than {fmt_bytes(max_bytes)}: not a {what}")
    available = available_host_bytes()
    if available is not None and size * JSON_MEMORY_FACTOR > available:
        raise InputError(
            f"{path} ({fmt_bytes(size)}) needs about {fmt_bytes(size * JSON_MEMORY_FACTOR)} of "
            f"memory to read, more than the {fmt_bytes(available)} available on this host"
        )


# No number a cbbench file holds is beyond a float: an integer of more digits than float's
# range (a 401-digit one in a baseline) raised OverflowError wherever it met a float (gate
# exited 1, its code for "regressed"; compare and report were tracebacks).
MAX_INT_DIGITS = 308


def bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits, beyond any number "
                         "cbbench reads")
    return int(text)

