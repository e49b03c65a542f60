"""The lines that say why a run's requests failed, printed on stderr after the run (`run`, and
each probe of `sweep` and `capacity`), as vLLM's bench and AIPerf's error summary print them.

The table shows only how many failed; the reason (a 404 for a model name the server does not
serve, a prompt over the model's context) was in the result JSON alone, so a first run against
a wrong --served-model read as a broken tool. One line per error type, most frequent first:
its count and one request's message, cut to one line. The counts are summary.error_types (a
--summary-only result has them too); the sample comes from the request records where kept.
"""

from __future__ import annotations

import json
import re

from cbbench.schema.run import RunResult

# A sample message's most characters on the console (the full text is in the result JSON).
SAMPLE_MAX_CHARS = 160
# What a failed record without an error_type is counted as (analysis/summary/columns.py).
UNTYPED = "error"
# "HTTP 404: <body>": the status, then the server's answer, a JSON error or an HTML page.
HTTP_PREFIX = re.compile(r"^(HTTP \d{3}): (.*)$", re.DOTALL)
HTML_TAG = re.compile(r"<[^>]*>")


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) <= SAMPLE_MAX_CHARS:
        return flat
    return flat[: SAMPLE_MAX_CHARS - 1].rstrip() + "…"


def _json_message(body: str) -> str | None:
    """An OpenAI-style error body's message ({"error": {"message": ...}}, {"message": ...},
    FastAPI's {"detail": ...}); None for any other body."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    err = doc.get("error")
    for holder, key in ((err, "message"), (doc, "message"), (doc, "detail")):
        if isinstance(holder, dict) and isinstance(holder.get(key), str):
            return holder[key]
    return err if isinstance(err, str) else None


def readable(message: str) -> str:
    """One line of a request's error: an HTTP error's JSON body shown as its message, an HTML
    page as its text, anything else as it is; whitespace folded, long text cut."""
    m = HTTP_PREFIX.match(message.strip())
    if m:
        status, body = m.groups()
        said = _json_message(body)
        if said is not None:
            body = said
        elif body.lstrip().startswith("<"):  # an HTML error page: its words, not its markup
            body = HTML_TAG.sub(" ", body)
        message = f"{status}: {body}"
    return _one_line(message)


def error_lines(result: RunResult) -> list[str]:
    """One line per error type of ``result`` (none when nothing failed), most frequent first:
    ``<count> request(s) failed (<type>): <one request's message>``."""
    counts = result.summary.error_types or {}
    if not counts:
        return []
    samples: dict[str, str] = {}
    for r in result.requests or []:
        if r.error is not None:
            samples.setdefault(r.error_type or UNTYPED, r.error)
    lines = []
    for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        line = f"{n} request{'s' if n != 1 else ''} failed ({kind})"
        if kind in samples:
            line += f": {readable(samples[kind])}"
        lines.append(line)
    return lines
