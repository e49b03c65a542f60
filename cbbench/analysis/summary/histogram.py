"""Log-bucketed histograms of per-token distributions: one module, two uses.

- ``log_histogram``: the compact ITL histogram kept in every result's summary
  (``itl_histogram``), so that the report can draw the ITL distribution without
  --save-detailed (issue 27). Bins are log-spaced, BINS_PER_DECADE per decade from LOW_MS up: a
  value's bin is floor(BINS_PER_DECADE * log10(v / LOW_MS)), so any quantile read from the
  histogram lies in the right bin, within a factor 10^(1/BINS_PER_DECADE) (12.2% for 20 per
  decade) of the exact one. Only non-empty bins are stored; gaps below LOW_MS (tokens of one
  event share one time) are counted apart as ``below``.
- ``LogHistogram``: a bounded-relative-error histogram for pooled distributions over millions
  of tokens (issue 28), HdrHistogram/DDSketch-style, fed in chunks as a stream. A positive value
  v goes to bucket i = ceil(log_gamma(v)) with gamma = (1 + a) / (1 - a); the bucket
  (gamma^(i-1), gamma^i] is represented by 2 gamma^i / (gamma + 1), which is within a relative
  error ``a`` of every value in it. An order statistic read from the buckets is then within
  ``a`` of the true one, and so is a numpy-style percentile (a convex combination of two
  neighbouring order statistics, both of the same sign). Zeros are counted apart, exactly.
  Count, mean and std are kept exactly (sums); per-request figures never go through this.
  Memory: one integer per occupied bucket, ~ln(max/min) / (2a) of them (a = 0.001 over
  0.01 ms-10 s: about 6,900).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cbbench.analysis.summary.percentiles import percentile_key

LOW_MS = 0.01
BINS_PER_DECADE = 20
RELATIVE_WIDTH = 10 ** (1 / BINS_PER_DECADE) - 1  # a bin's upper edge over its lower, minus 1


def log_histogram(values_ms: np.ndarray, weights: np.ndarray | None = None) -> dict:
    """The histogram of ``values_ms``; with ``weights``, of the multiset in which value j
    occurs weights[j] times (a compact run's pooled gaps: the same counts as the expanded
    array, each value's bin found once)."""
    v = np.asarray(values_ms, dtype=np.float64)
    finite = np.isfinite(v)
    v = v[finite]
    below = v < LOW_MS
    idx = np.floor(BINS_PER_DECADE * np.log10(v[~below] / LOW_MS)).astype(np.int64)
    if weights is None:
        bins, counts = np.unique(idx, return_counts=True)
        n_below = int(below.sum())
    else:
        w = np.asarray(weights, dtype=np.int64)[finite]
        low = int(idx.min()) if idx.size else 0
        per_bin = np.bincount(idx - low, weights=w[~below]).astype(np.int64)  # bins: a few 100
        bins = np.flatnonzero(per_bin) + low  # a bin whose values all had weight 0: not stored
        counts = per_bin[bins - low]
        n_below = int(w[below].sum())
    return {
        "unit": "ms",
        "low_ms": LOW_MS,
        "bins_per_decade": BINS_PER_DECADE,
        "below": n_below,
        "bins": bins.tolist(),
        "counts": counts.tolist(),
    }


@dataclass(frozen=True, slots=True)
class ItlHistogram:
    """summary.itl_histogram as :func:`log_histogram` writes it: bin i holds the values in
    [low_ms * 10^(i / bins_per_decade), low_ms * 10^((i + 1) / bins_per_decade)); ``below``
    counts those under low_ms."""

    unit: str
    low_ms: float
    bins_per_decade: int
    below: int
    bins: list[int]
    counts: list[int]

    @classmethod
    def of(cls, hist: ItlHistogram | Mapping[str, Any]) -> ItlHistogram:
        """The histogram, from its summary dict (a result's, or log_histogram's): its fields
        (one missing: KeyError, as the reader before), any other key left as it was."""
        if isinstance(hist, ItlHistogram):
            return hist
        return cls(**{f.name: hist[f.name] for f in fields(cls)})


def bin_edges_ms(hist: ItlHistogram | Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each stored bin's lower and upper edge in ms."""
    h = ItlHistogram.of(hist)
    b = np.asarray(h.bins, dtype=np.float64)
    per = h.bins_per_decade
    low = h.low_ms * 10 ** (b / per)
    return low, low * 10 ** (1 / per)


def cdf_points(hist: ItlHistogram | Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(x_ms, share at or below x) at each bin's lower and upper edge: the histogram's CDF,
    flat across empty bins and linear within a bin (where the histogram cannot say more)."""
    h = ItlHistogram.of(hist)
    low, high = bin_edges_ms(h)
    counts = np.asarray(h.counts, dtype=np.float64)
    below = float(h.below)
    total = counts.sum() + below
    if total == 0 or counts.size == 0:
        return np.zeros(0), np.zeros(0)
    after = below + np.cumsum(counts)
    before = after - counts
    x = np.column_stack([low, high]).ravel()
    y = np.column_stack([before, after]).ravel() / total
    return x, y


# ---- the bounded-relative-error histogram (pooled distributions at scale) ----------------
DEFAULT_RELATIVE_ERROR = 1e-3


class LogHistogram:
    def __init__(self, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        if not 0 < relative_error < 1:
            raise ValueError("relative_error must be in (0, 1)")
        self.relative_error = relative_error
        self.gamma = (1 + relative_error) / (1 - relative_error)
        self._log_gamma = math.log(self.gamma)
        self.buckets: dict[int, int] = {}
        self.zeros = 0
        self.count = 0
        self._sum = 0.0
        self._sum_sq = 0.0

    def add_many(self, values: Iterable[float] | np.ndarray,
                 weights: np.ndarray | None = None) -> None:
        """Add the values; with ``weights``, value j ``weights[j]`` times (a compact run's
        step gaps with the number of requests spanning each): the same buckets and count as
        the expanded array, the sums to float rounding."""
        a = np.asarray(values, dtype=np.float64)
        w = None if weights is None else np.asarray(weights, dtype=np.int64)
        if w is not None and (w < 0).any():
            raise ValueError("weights must be >= 0")
        if a.size == 0:
            return
        if (a < 0).any():
            raise ValueError("the histogram takes values >= 0")
        if w is None:
            self.count += int(a.size)
            self._sum += float(a.sum())
            self._sum_sq += float((a * a).sum())
        else:
            wf = w.astype(np.float64)
            self.count += int(w.sum())
            self._sum += float(np.dot(a, wf))
            self._sum_sq += float(np.dot(a * a, wf))
        positive = a > 0
        pos = a[positive]
        self.zeros += int(a.size - pos.size) if w is None else int(w[~positive].sum())
        keys = np.ceil(np.log(pos) / self._log_gamma).astype(np.int64)
        if w is None:
            idx, counts = np.unique(keys, return_counts=True)
        else:
            idx, inverse = np.unique(keys, return_inverse=True)
            counts = np.bincount(inverse, weights=w[positive], minlength=idx.size).astype(np.int64)
        b = self.buckets
        for i, c in zip(idx.tolist(), counts.tolist()):
            if c:
                b[i] = b.get(i, 0) + c

    def _value(self, i: int) -> float:
        return 2 * self.gamma ** i / (self.gamma + 1)

    def order_statistics(self, ranks: Sequence[int]) -> list[float]:
        """The values at the given 0-based ranks (ascending), each within the relative error."""
        keys = sorted(self.buckets)
        out = []
        for rank in ranks:
            if rank < self.zeros:
                out.append(0.0)
                continue
            seen = self.zeros
            for i in keys:
                seen += self.buckets[i]
                if rank < seen:
                    out.append(self._value(i))
                    break
        return out

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """numpy.percentile's linear interpolation, on the bucket values."""
        n = self.count
        out = []
        for q in qs:
            h = (n - 1) * q / 100
            lo = math.floor(h)
            hi = min(lo + 1, n - 1)
            a, b = self.order_statistics([lo, hi])
            out.append(a + (h - lo) * (b - a))
        return out

    def distribution(self, percentiles: Sequence[float] = (50, 90, 95, 99)) -> dict:
        """The fields of analysis.summary.metrics.distribution, plus the stated relative error."""
        if self.count == 0:
            return {"mean": None, "std": None, **{percentile_key(p): None for p in percentiles},
                    "count": 0, "relative_error": self.relative_error}
        mean = self._sum / self.count
        var = max(self._sum_sq / self.count - mean * mean, 0.0)
        pct = self.percentiles(percentiles)
        return {"mean": mean, "std": math.sqrt(var),
                **{percentile_key(p): v for p, v in zip(percentiles, pct)}, "count": self.count,
                "relative_error": self.relative_error}
