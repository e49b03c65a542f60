"""The per-request figures of a result, as the exporters see them.

One place decides which requests count as completed (no error, not cancelled: the set the
summary's distributions are computed over, cbbench/analysis/summary/metrics.py) so that every export's
statistics agree with the result's own summary.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def completed(requests: Sequence[dict]) -> list[dict]:
    return [r for r in requests if r.get("error") is None and not r.get("cancelled")]


def values(requests: Sequence[dict], key: str) -> np.ndarray:
    """The key's numeric values over the given requests, None (not measured) left out."""
    out = [r[key] for r in requests if isinstance(r.get(key), (int, float))]
    return np.asarray(out, dtype=np.float64)


def normalized_tpot_ms(requests: Sequence[dict]) -> np.ndarray:
    """E2EL divided by every output token, the first included (inference-perf's NTPOT)."""
    out = [
        r["e2el_ms"] / r["output_tokens"]
        for r in requests
        if isinstance(r.get("e2el_ms"), (int, float)) and (r.get("output_tokens") or 0) > 0
    ]
    return np.asarray(out, dtype=np.float64)
