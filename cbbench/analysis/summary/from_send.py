"""A request's TTFT and E2EL from its send: under --max-concurrency the wait for a slot left out,
as summary.from_send counts them. The SLO judge (slo.py) and the exports (export/requests.py,
br02.py) read them here, one rule for both."""

from __future__ import annotations

import math
from typing import TypeGuard

from cbbench.schema.run import Request


def known(v: object) -> TypeGuard[float]:
    """A measured figure: not None, and not NaN or an infinity (the exports write those as
    null, so they are not measured either)."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and not (isinstance(v, float) and not math.isfinite(v)))


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
    if known(send) and known(first) and known(last):
        return send, first, last
    return None


def ttft_from_send_ms(r: Request) -> float | None:
    if (sent := _sent(r)) is not None:
        return (sent[1] - sent[0]) * MS
    v = (r.model_extra or {}).get("ttft_from_send_ms")
    return v if known(v) else None


def e2el_from_send_ms(r: Request) -> float | None:
    if (sent := _sent(r)) is not None:
        return (sent[2] - sent[0]) * MS
    v = (r.model_extra or {}).get("e2el_from_send_ms")
    if known(v):
        return v
    ttft, e2el, ttft_intended = ttft_from_send_ms(r), r.e2el_ms, r.ttft_ms
    if known(ttft) and known(e2el) and known(ttft_intended):
        return ttft + (e2el - ttft_intended)
    return None
