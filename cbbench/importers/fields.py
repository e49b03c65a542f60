"""Another tool's file as models: each object an importer reads is a model naming the fields it
reads (as written: ``Any``, each checked where it is read, with the message that names it);
the fields it does not read pass through."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.finite import is_finite


class ToolFields(BaseModel):
    """An object of another tool's file: the fields read of it, as written."""

    model_config = ConfigDict(extra="allow")


M = TypeVar("M", bound=ToolFields)


def part(model: type[M], v: Any, where: str, key: str, tool: str) -> M:
    """The file's object ``key`` (``v``, as written) as ``model``: absent or empty, every field
    its default; anything but an object is refused in one line naming it."""
    if not v:
        return model()
    if not isinstance(v, dict):
        raise UsageError(f"{where}: {key} holds {v!r:.40}, not an object ({tool} writes an "
                         "object there)")
    return model.model_validate(v)


# ---- a value as written, checked where it is read: one line naming the file's key ----------
def count(v: Any, where: str, key: str, what: str = "a token count") -> int:
    """``v`` (the file's ``key``) as an integer >= 0 (a count, or a time in whole ns)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UsageError(f"{where}: {key} holds {v!r}, not {what}")
    return v


def number(v: Any, where: str, key: str, what: str, low: float = -math.inf) -> float:
    """``v`` (the file's ``key``) as a finite number >= ``low``."""
    if not is_finite(v) or v < low:
        raise UsageError(f"{where}: {key} holds {v!r}, not {what}")
    return float(v)


def positive(v: Any) -> float | None:
    """A duration a tool wrote, when it is a finite number > 0; None otherwise."""
    return float(v) if is_finite(v) and v > 0 else None


def duration_s(recs: Sequence[RequestRecord], stated: Any = None) -> float:
    """The run's duration: the tool's own (``stated``) when it wrote a usable one, else the
    last token's time."""
    if (d := positive(stated)) is not None:
        return d
    ends = [r.token_times_s[-1] for r in recs if r.token_times_s]
    return max(ends) if ends else 0.0


# A tool that times each streamed chunk but not how many tokens it held (vLLM bench, AIPerf):
# each chunk's tokens, and how they were found (records.event_tokens_method). cbbench's ITL is
# per token -- a chunk of k tokens after a gap g is k gaps of g / k -- so a chunk taken as one
# token when it held three makes ITL a per-chunk figure (3x too long) under a per-token name.
CHUNK_COUNT = "chunk_count"  # fixed by the counts: one chunk per token, or a single chunk
SPREAD = "spread"  # an estimate: the first chunk one token, the rest shared evenly


def spread_tokens(tokens: int, chunks: int) -> list[int]:
    """``tokens`` over ``chunks`` (>= 2) chunks: the first one token (the first token streams
    on its own, after the prefill), the rest shared as evenly as whole tokens go, the larger
    shares first (a chunk after the last token's gets none)."""
    rest, n = max(tokens - 1, 0), chunks - 1
    return [min(tokens, 1), *(rest // n + (i < rest % n) for i in range(n))]


def chunk_tokens(chunks: int, tokens: int) -> tuple[list[int], str] | None:
    """(tokens per chunk, method) for ``chunks`` timed chunks of a request of ``tokens`` output
    tokens; None where there is nothing to split (no chunk or no token)."""
    if chunks < 1 or tokens < 1:
        return None
    if chunks == 1:
        return [tokens], CHUNK_COUNT
    if chunks == tokens:
        return [1] * tokens, CHUNK_COUNT
    return spread_tokens(tokens, chunks), SPREAD


def base_config(tool: str, num_requests: int) -> dict:
    """The result config every import starts from (an importer sets what its file says)."""
    return {
        "label": None,
        "imported_from": tool,
        "workload": "unknown",
        "num_requests": num_requests,
        "request_rate": None,
        "target": "http",
    }
