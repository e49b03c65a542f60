"""What no export format can hold, made writable: a lone surrogate (a result's JSON may carry
"\\ud800", which no UTF-8 file can) as U+FFFD, and NaN or an infinity (BR0.2 is strict JSON)
as null. Both were tracebacks."""

from __future__ import annotations

import math
import re

from cbbench.analysis.result import clean_text

# What XML 1.0 cannot hold at all, not even as a character reference (its Char production): the
# C0 controls but tab, newline and carriage return, and U+FFFE/U+FFFF. A JUnit reader refuses
# the whole file for one of them.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(value: str) -> str:
    """``value`` made UTF-8 with every character XML 1.0 forbids as U+FFFD."""
    return _NOT_XML.sub("\ufffd", clean_text(value))


def clean(value):
    """``value`` with its texts (keys too) made UTF-8 and its non-finite floats as None."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def clean_texts(value):
    """``value`` with only its texts made UTF-8: a report built from a result's raw fields
    holds what it would hold built from the cleaned result (a text's surrogates are replaced
    one by one, wherever the text lands in a longer one)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_texts(k): clean_texts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_texts(v) for v in value]
    return value
