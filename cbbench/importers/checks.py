"""An imported run passes the rules a measured one does, or the import fails in one line
(issue 37, rule 3): AIPerf, GuideLLM and inference-perf files with backward times imported as
TTFT -999,900 ms, TPOT -367 ms and a duration of -49 s, exit 0; a 15 KB GuideLLM file asking
for 10^11 token events made numpy ask for 745 GiB; and files gate and export then refused were
written. Each importer bounds its counts with these limits before it builds anything from
them; every record is then held to the measured records' rules, and the result to the run
schema (cbbench/schema/) that every reader of a result applies."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.finite import is_finite

if TYPE_CHECKING:
    from cbbench.schema.run import RunResult

# Tokens one request may claim. Outputs are expanded into per-event times (memory per
# token), so their bound is tighter: a million output tokens in one answer is beyond any
# server; a prompt of 2^27 tokens is beyond any context.
MAX_OUTPUT_TOKENS = 1 << 20
MAX_PROMPT_TOKENS = 1 << 27
# The client's clock resolution: a token time earlier than its request's send by more is a
# time running backwards, not rounding.
BACKWARDS_SLACK_S = 1e-6


def check_count(v: int, limit: int, what: str, where: str) -> int:
    """``v`` when it is a count in [0, limit]; else UsageError naming it."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= limit:
        raise UsageError(f"{where}: {what} holds {v!r:.40}, not a token count in [0, {limit}]")
    return v


def record_problem(r: RequestRecord) -> str | None:
    """What breaks a measured record's rules in ``r``, or None: counts bounded, times finite,
    at or after the run's start, and running forwards from the send."""
    if not (0 <= r.prompt_tokens <= MAX_PROMPT_TOKENS):
        return f"prompt tokens {r.prompt_tokens} outside [0, {MAX_PROMPT_TOKENS}]"
    if not (0 <= r.output_tokens <= MAX_OUTPUT_TOKENS):
        return f"output tokens {r.output_tokens} outside [0, {MAX_OUTPUT_TOKENS}]"
    starts = [("intended start", r.intended_start_s), ("send", r.send_s)]
    for what, v in starts:
        if v is not None and not (is_finite(v) and v >= -BACKWARDS_SLACK_S):
            return f"its {what} time {v!r} is before the run's start or not a time"
    times = r.token_times_s or []
    if len(times) > MAX_OUTPUT_TOKENS:
        return f"{len(times)} token times, more than {MAX_OUTPUT_TOKENS}"
    if any(not is_finite(t) for t in times):
        return "a token time is not a finite number"
    origin = r.send_s if r.send_s is not None else r.intended_start_s
    if times and times[0] < origin - BACKWARDS_SLACK_S:
        return (f"its first token ({times[0]:.6g} s) comes before its send ({origin:.6g} s): "
                f"a TTFT of {(times[0] - origin) * 1e3:.6g} ms; its times run backwards")
    for a, b in zip(times, times[1:]):
        if b < a - BACKWARDS_SLACK_S:
            return f"its token times run backwards ({a:.6g} s, then {b:.6g} s)"
    if r.first_output_s is not None and times and not (
            is_finite(r.first_output_s) and times[0] - BACKWARDS_SLACK_S <= r.first_output_s):
        return f"its first output token ({r.first_output_s!r}) comes before its first token"
    for what in ("server_request_id", "model"):  # joined and grouped by: a string or nothing
        v = getattr(r, what, None)
        if v is not None and not isinstance(v, str):
            return f"its {what} is a {type(v).__name__}, not a string"
    if r.event_tokens is not None and any(
            isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in r.event_tokens):
        return "an event's token count is not a count"
    return None


def check_records(records: Sequence[RequestRecord], duration_s: float, source: str) -> None:
    """UsageError (one line) for the first record, or the duration, a measured run could not
    have."""
    for i, r in enumerate(records):
        if (problem := record_problem(r)) is not None:
            raise UsageError(f"{source}: request {i}: {problem}")
    if not (is_finite(duration_s) and duration_s >= 0):
        raise UsageError(f"{source}: the run's duration is {duration_s!r} s: its times run "
                         "backwards")


def check_result(result: dict, source: str) -> RunResult:
    """The result as it will be written, as the run schema every reader applies holds it (so
    gate, compare, report and export read what import writes)."""
    from cbbench.analysis.result import dumps
    from cbbench.schema import parse_run

    try:
        return parse_run(json.loads(dumps(result)), f"the result imported from {source}")
    except UsageError as e:
        raise UsageError(f"{source}: the imported run breaks the result schema: {e}") from None
