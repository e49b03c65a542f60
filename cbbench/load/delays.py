"""Delay distributions in milliseconds, for --think-time and --cancel-after.

``500`` is a constant 500 ms; ``exp:500`` is exponential with a 500 ms mean (memoryless: how
long a person takes to read and type, or to give up, is commonly modelled so);
``uniform:200:800`` is uniform between the two. Draws are seeded per event by the caller, so a
session's think times or a request's cancel time do not depend on the order things happen in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cbbench.errors import UsageError

MS = 1000.0
# The longest delay that means anything in a benchmark (the arrival schedule's own limit).
MAX_DELAY_MS = 30 * 24 * 3600 * MS


@dataclass(frozen=True)
class Delay:
    kind: str  # const | exp | uniform
    a_ms: float  # the constant, the mean, or the low end
    b_ms: float = 0.0  # the high end (uniform)

    def sample_s(self, rng: np.random.Generator) -> float:
        if self.kind == "const":
            return self.a_ms / MS
        if self.kind == "exp":
            return float(rng.exponential(self.a_ms)) / MS if self.a_ms > 0 else 0.0
        return float(rng.uniform(self.a_ms, self.b_ms)) / MS

    def text(self) -> str:
        if self.kind == "const":
            return f"{self.a_ms:g}"
        if self.kind == "exp":
            return f"exp:{self.a_ms:g}"
        return f"uniform:{self.a_ms:g}:{self.b_ms:g}"


def _ms(text: str, flag: str, whole: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise UsageError(
            f"invalid {flag} {whole!r}: milliseconds >= 0, as N, exp:MEAN or uniform:LOW:HIGH"
        )
    if v > MAX_DELAY_MS:
        raise UsageError(f"invalid {flag} {whole!r}: at most {MAX_DELAY_MS:.0f} ms (30 days)")
    return v


def parse_delay(text: str, flag: str) -> Delay:
    """'500' | 'exp:500' | 'uniform:200:800' (milliseconds) -> Delay."""
    parts = text.strip().split(":")
    if len(parts) == 1:
        return Delay("const", _ms(parts[0], flag, text))
    kind, args = parts[0].lower(), parts[1:]
    if kind == "exp" and len(args) == 1:
        return Delay("exp", _ms(args[0], flag, text))
    if kind == "uniform" and len(args) == 2:
        low, high = _ms(args[0], flag, text), _ms(args[1], flag, text)
        if low > high:
            raise UsageError(f"invalid {flag} {text!r}: LOW must not exceed HIGH")
        return Delay("uniform", low, high)
    raise UsageError(
        f"invalid {flag} {text!r}: milliseconds as N, exp:MEAN or uniform:LOW:HIGH"
    )
