"""Reading `cbbench serve --request-log` (a JSON line per request) for `audit` and `run
--server-log`: every line is checked before a reader indexes it, so a file that is not such a
log fails in one line naming the line, never a traceback (issue 37: a binary file, ``events``
as a string or of short pairs, 10^30-token events, negative times that printed a transit of
-1.8e12 ms, /dev/zero and a FIFO that hung)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cbbench.analysis.input_file import check_input_file
from cbbench.errors import UsageError
from cbbench.finite import is_finite

# The largest median error (ms) `audit` lets a client's timing have against this log by default.
# Here, beside the reader, so `cbbench audit`'s default costs no numpy or result models at
# registration (`cbbench --help` registers every command); analysis/server_side/audit.py uses it.
DEFAULT_TOLERANCE_MS = 2.0
# One line holds one request's stream events: [time, tokens] pairs of ~25 bytes; a million
# events is far beyond any context, and a line past this is not a request log's.
MAX_LINE_BYTES = 64 << 20
# Tokens in one event or one request: far beyond any model's context (2^31).
MAX_TOKENS = 1 << 31
TIME_FIELDS = (
    "arrival", "submitted", "admitted", "queue_exit", "first_token", "first_token_sent",
    "first_output", "first_output_sent", "last_token", "last_token_sent",
)
COUNT_FIELDS = ("prompt_tokens", "output_tokens", "reasoning_tokens", "tool_call_tokens",
                "cached_tokens", "preemptions")


def _is_time(v) -> bool:
    """An epoch time as the server writes it: a finite number >= 0."""
    return is_finite(v) and v >= 0


def as_number(v) -> float | None:
    """A time or duration as a log line or a response wrote it: a float, None if not a number."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def queued_at(line: LogLine) -> float | None:
    """When the engine's scheduler took the request in (where the server's queue time starts,
    as vLLM's and the response's ``queue_time_ms``): the log's ``admitted``; its
    ``submitted`` in a log written before it had one."""
    adm = as_number(line.admitted)
    return adm if adm is not None else as_number(line.submitted)


def is_count(v) -> bool:
    """A token count as the log and the result write it: an int (not a bool) in [0, MAX_TOKENS]."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKENS


@dataclass(frozen=True, slots=True)
class LogLine:
    """One request-log line as the readers use it (its other fields are not read); a field the
    line lacks is None. The types are those :func:`line_problem` holds a file's line to; a
    line a caller built is taken as it is."""

    id: str | None = None
    status: int | None = None  # the HTTP status
    finish: str | None = None  # the finish reason: length | stop | abort | error ...
    events: list[list[Any]] | None = None  # [[time, tokens, kind], ...]: each event written
    # Epoch seconds (TIME_FIELDS).
    arrival: float | None = None
    submitted: float | None = None
    admitted: float | None = None
    queue_exit: float | None = None
    first_token: float | None = None
    first_token_sent: float | None = None
    first_output: float | None = None
    first_output_sent: float | None = None
    last_token: float | None = None
    last_token_sent: float | None = None
    # Counts (COUNT_FIELDS).
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    tool_call_tokens: int | None = None
    cached_tokens: int | None = None
    preemptions: int | None = None

    @classmethod
    def of(cls, line: LogLine | Mapping[str, Any]) -> LogLine:
        """The line's fields as they are (JSON values, not yet checked): read_server_log's
        lines are the file's dicts, and a caller may hand in a LogLine of its own."""
        if isinstance(line, LogLine):
            return line
        return cls(**{name: line.get(name) for name in LOG_LINE_FIELDS})


LOG_LINE_FIELDS = tuple(f.name for f in fields(LogLine))


def line_problem(ll: LogLine) -> str | None:
    """What makes ``ll`` not a request-log line the readers can use, or None."""
    if not isinstance(ll.id, str):
        return "not a cbbench serve request-log line (no string 'id')"
    for k in TIME_FIELDS:
        if (v := getattr(ll, k)) is not None and not _is_time(v):
            return f"{k!r} must be a time in seconds >= 0, got {v!r:.40}"
    for k in COUNT_FIELDS:
        if (v := getattr(ll, k)) is not None and not is_count(v):
            return f"{k!r} must be a count in [0, {MAX_TOKENS}], got {v!r:.40}"
    if ll.status is not None and not is_count(ll.status):
        return f"'status' must be an HTTP status, got {ll.status!r:.40}"
    if ll.finish is not None and not isinstance(ll.finish, str):
        return f"'finish' must be a string, got {type(ll.finish).__name__}"
    events = ll.events
    if events is None:
        return None
    if not isinstance(events, list):
        return f"'events' must be a list of [time, tokens, kind] events, got {type(events).__name__}"
    for i, e in enumerate(events):
        if not (isinstance(e, list) and len(e) in (2, 3) and _is_time(e[0])
                and is_count(e[1]) and (len(e) == 2 or isinstance(e[2], str))):
            return (f"events[{i}] must be [time >= 0, tokens in [0, {MAX_TOKENS}], kind], "
                    f"got {e!r:.60}")
    if ll.arrival is None and events:
        return "a line with events needs its 'arrival' time"
    return None


def read_server_log(path: Path | str) -> dict[str, dict]:
    """The request log's lines by id (a later line with the same id wins); UsageError (one
    line, naming the file's line) for a file that is not such a log."""
    # The JSON files' rule (engine/json_file.py): an integer of 401 digits passed json.loads
    # and raised OverflowError in the checks' math.isfinite, a traceback. Imported here: this
    # module is read when `cbbench --help` registers `audit`.
    from cbbench.engine.json_file import bounded_int

    check_input_file(path, "server log")
    out: dict[str, dict] = {}
    try:
        with open(path, "rb") as f:
            n = 0
            while raw := f.readline(MAX_LINE_BYTES + 1):
                n += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise UsageError(f"{path}:{n}: a line longer than {MAX_LINE_BYTES} bytes: "
                                     "not a cbbench serve request log")
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw, parse_int=bounded_int)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                    # not JSON, not UTF-8, nested too deeply
                    raise UsageError(f"{path}:{n}: not a JSON line") from None
                except ValueError as e:  # an integer past every number cbbench reads
                    raise UsageError(f"{path}:{n}: not a request-log line: {e}") from None
                if not isinstance(line, dict):
                    raise UsageError(f"{path}:{n}: not a cbbench serve request-log line")
                ll = LogLine.of(line)
                if (problem := line_problem(ll)) is not None:
                    raise UsageError(f"{path}:{n}: {problem}")
                assert ll.id is not None  # line_problem: a string id
                out[ll.id] = line
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    return out
