"""The per-request figures of a result, as the exporters see them.

One place decides which requests count as completed (no error, not cancelled: the set the
summary's distributions are computed over, cbbench/analysis/summary/metrics.py) so that every export's
statistics agree with the result's own summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeGuard

import numpy as np

from cbbench.schema.run import Request


def completed(requests: Sequence[Request]) -> list[Request]:
    return [r for r in requests if r.error is None and not r.cancelled]


def _known(v: object) -> TypeGuard[float]:
    """A measured figure: not None, and not NaN or an infinity (the exports write those as
    null, so they are not measured either)."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and not (isinstance(v, float) and not math.isfinite(v)))


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


# From the send (--max-concurrency: the wait for a slot left out), as summary.from_send counts
# them: (token time - send) * 1000 from a --save-detailed request's times, the same operations
# as the summary's, else from its stored figures (ttft_from_send_ms; E2EL from send is that
# plus the request's last-minus-first token time, e2el_ms - ttft_ms, where the result has no
# e2el_from_send_ms).
MS = 1000.0


def _sent(r: Request) -> tuple[float, float, float] | None:
    """(send, first token, last token) of a --save-detailed request, on the run's clock."""
    times = r.token_times_s
    if not times:
        return None
    send, first, last = r.send_s, times[0], times[-1]
    if _known(send) and _known(first) and _known(last):
        return send, first, last
    return None


def ttft_from_send_ms(r: Request) -> float | None:
    if (sent := _sent(r)) is not None:
        return (sent[1] - sent[0]) * MS
    v = (r.model_extra or {}).get("ttft_from_send_ms")
    return v if _known(v) else None


def e2el_from_send_ms(r: Request) -> float | None:
    if (sent := _sent(r)) is not None:
        return (sent[2] - sent[0]) * MS
    v = (r.model_extra or {}).get("e2el_from_send_ms")
    if _known(v):
        return v
    ttft, e2el, ttft_intended = ttft_from_send_ms(r), r.e2el_ms, r.ttft_ms
    if _known(ttft) and _known(e2el) and _known(ttft_intended):
        return ttft + (e2el - ttft_intended)
    return None
