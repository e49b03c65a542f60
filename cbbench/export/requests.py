"""The per-request figures of a result, as the exporters see them.

One place decides which requests count as completed (no error, not cancelled: the set the
summary's distributions are computed over, cbbench/analysis/summary/metrics.py) so that every export's
statistics agree with the result's own summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from cbbench.schema.run import Request


def completed(requests: Sequence[Request]) -> list[Request]:
    return [r for r in requests if r.error is None and not r.cancelled]


def _known(v: float | None) -> bool:
    """A measured figure: not None, and not NaN or an infinity (the exports write those as
    null, so they are not measured either)."""
    return v is not None and not (isinstance(v, float) and not math.isfinite(v))


def values(requests: Sequence[Request], field: Callable[[Request], float | None]) -> np.ndarray:
    """The field's numeric values over the given requests, those not measured left out."""
    out = [v for r in requests if _known(v := field(r))]
    return np.asarray(out, dtype=np.float64)


def normalized_tpot_ms(requests: Sequence[Request]) -> np.ndarray:
    """E2EL divided by every output token, the first included (inference-perf's NTPOT)."""
    out = [
        e2el / n
        for r in requests
        if (e2el := r.e2el_ms) is not None and _known(e2el) and (n := r.output_tokens or 0) > 0
    ]
    return np.asarray(out, dtype=np.float64)
