"""Public LLM-serving traces, recognized by their header and loaded as timed workloads.

- **Azure LLM inference traces** (2023 Splitwise, 2024 DynamoLLM; CSV ``TIMESTAMP``,
  ``ContextTokens``, ``GeneratedTokens``). ``TIMESTAMP`` is a wall-clock time,
  ``2023-11-16 18:15:46.6805900`` (2023: 100 ns ticks) or ``2024-05-10 00:00:00.009930+00:00``
  (2024: microseconds and a UTC offset, the fraction left out on whole seconds).
- **BurstGPT** (CSV ``Timestamp``, ``Model``, ``Request tokens``, ``Response tokens``,
  ``Total tokens``, ``Log Type``; release 2 adds ``Session ID`` and ``Elapsed time``).
  ``Timestamp`` is seconds from the trace's start. Rows with 0 request or response tokens
  are the trace's failed requests: they are skipped, and the workload says how many; a row
  of 0 prompt or output tokens in the other traces likewise.
- **Mooncake / FAST'25** (JSONL ``timestamp`` in milliseconds, ``input_length``,
  ``output_length``, ``hash_ids``). Each hash id names one 512-token block of the prompt;
  equal ids are equal blocks (and, hashed in a chain, equal prefixes). The blocks become token
  ids when a target needs them (``WorkloadRequest.token_ids``): every hash id always gives the
  same 512 ids, so the engine's prefix cache sees the trace's real sharing.

Times are kept exact: the arrival of each request is its offset from the earliest timestamp in
the file, computed in integer nanoseconds before the one conversion to float seconds.
"""

from __future__ import annotations

import calendar
import csv
import datetime as _dt
import json
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path

from cbbench.errors import UsageError
from cbbench.finite import is_finite
from cbbench.load.hash_blocks import MOONCAKE_BLOCK_TOKENS
from cbbench.load.jsonl import json_int, jsonl_lines, jsonl_objects
from cbbench.load.workload_types import Workload, WorkloadRequest

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = (
    "Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type",
)
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
_AZURE_TIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:(Z)|([+-])(\d{2}):?(\d{2}))?$",
    re.ASCII,
)
# ASCII digits (re's \d takes any script's), a whole part int() reads in a blink.
MAX_COUNT_DIGITS = 18
_DECIMAL = re.compile(r"^[0-9]{1,18}(\.[0-9]{1,9})?$")
MAX_SHOWN_CHARS = 40


def _first_line(path: Path) -> str:
    """The first non-blank line, read with the JSONL loader's line reader (up to its 64 MiB
    a line): a 64 KiB peek cut a long Mooncake first line (many hash_ids), which then was not
    recognised and the error blamed the JSONL format."""
    for _, line in jsonl_lines(path):
        line = line.lstrip("\ufeff").strip()
        if line:
            return line
    return ""


def detect_format(path: Path) -> str | None:
    """'azure', 'burstgpt' or 'mooncake' from the file's first line; None for anything else
    (a cbbench JSONL workload, or not a trace)."""
    line = _first_line(path)
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # not a Mooncake line: the JSONL loader says why
            return None
        if isinstance(obj, dict) and all(k in obj for k in MOONCAKE_FIELDS):
            return "mooncake"
        return None
    columns = [c.strip() for c in next(csv.reader([line]))]
    if all(c in columns for c in AZURE_COLUMNS):
        return "azure"
    if all(c in columns for c in BURSTGPT_COLUMNS):
        return "burstgpt"
    return None


def load_trace(path: Path, fmt: str) -> Workload:
    loaders: dict[str, Callable[[Path], Workload]] = {
        "azure": load_azure,
        "burstgpt": load_burstgpt,
        "mooncake": load_mooncake,
    }
    return loaders[fmt](path)


# ---- helpers ---------------------------------------------------------------------------------
def _shown(text: str) -> str:
    """A cell as a message shows it: a 5000-digit number is cut, not printed whole."""
    return repr(text) if len(text) <= MAX_SHOWN_CHARS else repr(text[:MAX_SHOWN_CHARS]) + "..."


def _count(text: str, where: str, column: str) -> int:
    t = text.strip()
    # ASCII digits only: str.isdigit() takes '²', which int() refuses (a traceback), and a
    # count of more digits than MAX_COUNT_DIGITS is no token count (int() refuses 4300+).
    if not (t.isascii() and t.isdigit()) or len(t) > MAX_COUNT_DIGITS:
        raise UsageError(
            f"{where}: {column} must be a whole number >= 0 (at most {MAX_COUNT_DIGITS} "
            f"digits), got {_shown(text)}"
        )
    return int(t)


def _timed_workload(
    name: str, description: str, rows: Sequence[tuple[int, int, int, tuple[int, ...] | None]],
    skipped: int, path: Path,
) -> Workload:
    """rows: (time in ns, prompt_len, output_len, hash_ids); arrivals relative to the
    earliest time."""
    if not rows:
        raise UsageError(f"trace {path} holds no usable requests")
    t0 = min(r[0] for r in rows)
    reqs = [
        WorkloadRequest(i, p, o, arrival_s=(t - t0) / NS_PER_S, hash_ids=h)
        for i, (t, p, o, h) in enumerate(rows)
    ]
    notes: tuple[str, ...] = ()
    if skipped:
        notes = (f"{path.name}: skipped {skipped} rows with 0 prompt or output tokens "
                 "(failed requests in the trace)",)
    return Workload(name, reqs, description, notes=notes)


def _csv_rows(path: Path, columns: tuple[str, ...]):
    """(where, {column: text}) for every data row of a CSV trace. Read as a stream with the
    JSONL loader's line reader (each line capped): the whole file was read into memory, so a
    trace larger than memory was a MemoryError traceback (trace rows hold no quoted line
    breaks, so a line is a row)."""
    header = None
    for lineno, line in jsonl_lines(path):
        where = f"{path}:{lineno}"
        if lineno == 1:
            line = line.lstrip("\ufeff")
        if header is None and not line.strip():
            continue  # blank lines before the header, skipped as detect_format skips them
        try:
            row = next(csv.reader([line]), [])
        except csv.Error as e:  # a field beyond csv's size limit, a NUL
            raise UsageError(f"{where}: not a CSV row ({e})") from None
        if header is None:
            header = [c.strip() for c in row]
            index = {c: header.index(c) for c in columns}
            continue
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise UsageError(f"{where}: {len(row)} fields, the header has {len(header)}")
        yield where, {c: row[i] for c, i in index.items()}


# ---- Azure -----------------------------------------------------------------------------------
def parse_azure_time(text: str, where: str) -> int:
    """Nanoseconds since the epoch of an Azure trace TIMESTAMP (UTC unless it says otherwise)."""
    m = _AZURE_TIME.match(text.strip())
    if m is None:
        raise UsageError(
            f"{where}: TIMESTAMP {text!r} is not a time like 2023-11-16 18:15:46.6805900"
        )
    y, mo, d, hh, mm, ss, frac, zulu, sign, oh, om = m.groups()
    try:
        # datetime checks the day against its month (calendar.timegm took Feb 31 as Mar 3).
        _dt.date(int(y), int(mo), int(d))
        seconds = calendar.timegm((int(y), int(mo), int(d), int(hh), int(mm), int(ss)))
    except (ValueError, OverflowError):
        raise UsageError(f"{where}: TIMESTAMP {text!r} is not a valid date") from None
    if not (int(hh) < 24 and int(mm) < 60 and int(ss) < 61 and int(oh or 0) < 24
            and int(om or 0) < 60):
        raise UsageError(f"{where}: TIMESTAMP {text!r} is not a valid date")
    if sign:
        offset = (int(oh) * 60 + int(om)) * 60
        seconds -= offset if sign == "+" else -offset
    ns = int((frac or "").ljust(9, "0"))
    return seconds * NS_PER_S + ns


def load_azure(path: Path) -> Workload:
    rows = []
    skipped = 0
    for where, r in _csv_rows(path, AZURE_COLUMNS):
        t = parse_azure_time(r["TIMESTAMP"], where)
        p = _count(r["ContextTokens"], where, "ContextTokens")
        o = _count(r["GeneratedTokens"], where, "GeneratedTokens")
        if p == 0 or o == 0:
            skipped += 1
            continue
        rows.append((t, p, o, None))
    return _timed_workload(
        path.name, f"Azure LLM inference trace {path.name}", rows, skipped, path
    )


# ---- BurstGPT --------------------------------------------------------------------------------
def _decimal_ns(text: str, where: str, column: str, unit_ns: int) -> int:
    """A non-negative decimal in some unit, as integer nanoseconds (exact to 1 ns)."""
    t = text.strip()
    if not _DECIMAL.match(t):
        raise UsageError(f"{where}: {column} must be a number >= 0 (at most "
                         f"{MAX_COUNT_DIGITS} digits before the point), got {_shown(text)}")
    whole, _, frac = t.partition(".")
    return int(whole) * unit_ns + int(frac.ljust(9, "0")) * unit_ns // NS_PER_S


def load_burstgpt(path: Path) -> Workload:
    rows = []
    skipped = 0
    for where, r in _csv_rows(path, BURSTGPT_COLUMNS):
        t = _decimal_ns(r["Timestamp"], where, "Timestamp", NS_PER_S)
        p = _count(r["Request tokens"], where, "Request tokens")
        o = _count(r["Response tokens"], where, "Response tokens")
        if p == 0 or o == 0:
            skipped += 1
            continue
        rows.append((t, p, o, None))
    return _timed_workload(path.name, f"BurstGPT trace {path.name}", rows, skipped, path)


# ---- Mooncake --------------------------------------------------------------------------------
def load_mooncake(path: Path) -> Workload:
    rows = []
    skipped = 0
    for where, obj in jsonl_objects(path):
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: expected a JSON object")
        missing = [k for k in MOONCAKE_FIELDS if k not in obj]
        if missing:
            raise UsageError(f"{where}: missing {', '.join(missing)}")
        ts = obj["timestamp"]
        if not is_finite(ts) or ts < 0:
            raise UsageError(f"{where}: 'timestamp' must be a number of milliseconds >= 0")
        # Decimal(repr) is the number as written (repr round-trips), so the ns are exact.
        t = int(Decimal(repr(ts)) * NS_PER_MS)
        p = json_int(obj, "input_length", where, 0)
        o = json_int(obj, "output_length", where, 0)
        if p == 0 or o == 0:  # a failed request, skipped as the CSV traces skip theirs
            skipped += 1
            continue
        hashes = None
        if "hash_ids" in obj:
            h = obj["hash_ids"]
            if not isinstance(h, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in h
            ):
                raise UsageError(f"{where}: 'hash_ids' must be a list of integers >= 0")
            blocks = -(-p // MOONCAKE_BLOCK_TOKENS)
            if len(h) > blocks:
                raise UsageError(
                    f"{where}: {len(h)} hash_ids of {MOONCAKE_BLOCK_TOKENS} tokens, but "
                    f"input_length {p} fills only {blocks}"
                )
            hashes = tuple(h) if h else None
        rows.append((t, p, o, hashes))
    return _timed_workload(path.name, f"Mooncake trace {path.name}", rows, skipped, path)
