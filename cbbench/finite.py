"""A finite number as a file holds it: the one test every reader of another tool's or a
result's numbers applies."""

from __future__ import annotations

import math
from typing import TypeGuard


def is_finite(v: object) -> TypeGuard[float]:
    """An int or a float, not a bool (JSON's true is not 1), NaN or an infinity: a TypeGuard,
    so the checked value reads as a number."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
