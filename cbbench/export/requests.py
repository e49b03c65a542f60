"""The per-request figures of a result, as the exporters see them.

One place decides which requests count as completed (no error, not cancelled: the set the
summary's distributions are computed over, cbbench/analysis/summary/metrics.py) so that every export's
statistics agree with the result's own summary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cbbench.analysis.summary.from_send import (  # noqa: F401 (the exporters' names)
    MS,
    e2el_from_send_ms,
    ttft_from_send_ms,
)
from cbbench.analysis.summary.from_send import (
    known as _known,
)
from cbbench.schema.run import Request


def completed(requests: Sequence[Request]) -> list[Request]:
    return [r for r in requests if r.error is None and not r.cancelled]


def values(requests: Sequence[Request], field: Callable[[Request], float | None]) -> np.ndarray:
    """The field's numeric values over the given requests, those not measured left out."""
    out = [v for r in requests if _known(v := field(r))]
    return np.asarray(out, dtype=np.float64)


def normalized_tpot_ms(requests: Sequence[Request],
                       e2el_ms: Callable[[Request], float | None] | None = None) -> np.ndarray:
    """E2EL divided by every output token, the first included (inference-perf's NTPOT);
    ``e2el_ms``: each request's E2EL (default: its ``e2el_ms``, from the intended start)."""
    e2el_of = e2el_ms or (lambda r: r.e2el_ms)
    out = [
        e2el / n
        for r in requests
        if _known(e2el := e2el_of(r)) and (n := r.output_tokens or 0) > 0
    ]
    return np.asarray(out, dtype=np.float64)
