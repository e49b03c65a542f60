"""A compact log-binned histogram of per-token gaps, kept in every result's summary so that the
report can draw the ITL distribution without --save-detailed (issue 27).

Bins are log-spaced, BINS_PER_DECADE per decade from LOW_MS up: a value's bin is
floor(BINS_PER_DECADE * log10(v / LOW_MS)), so any quantile read from the histogram lies in the
right bin, within a factor 10^(1/BINS_PER_DECADE) (12.2% for 20 per decade) of the exact one.
Only non-empty bins are stored; gaps below LOW_MS (tokens of one event share one time) are
counted apart as ``below``.
"""

from __future__ import annotations

import numpy as np

LOW_MS = 0.01
BINS_PER_DECADE = 20
RELATIVE_WIDTH = 10 ** (1 / BINS_PER_DECADE) - 1  # a bin's upper edge over its lower, minus 1


def log_histogram(values_ms: np.ndarray) -> dict:
    v = np.asarray(values_ms, dtype=np.float64)
    v = v[np.isfinite(v)]
    below = v < LOW_MS
    idx = np.floor(BINS_PER_DECADE * np.log10(v[~below] / LOW_MS)).astype(np.int64)
    bins, counts = np.unique(idx, return_counts=True)
    return {
        "unit": "ms",
        "low_ms": LOW_MS,
        "bins_per_decade": BINS_PER_DECADE,
        "below": int(below.sum()),
        "bins": bins.tolist(),
        "counts": counts.tolist(),
    }


def bin_edges_ms(hist: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each stored bin's lower and upper edge in ms."""
    b = np.asarray(hist["bins"], dtype=np.float64)
    per = hist["bins_per_decade"]
    low = hist["low_ms"] * 10 ** (b / per)
    return low, low * 10 ** (1 / per)


def cdf_points(hist: dict) -> tuple[np.ndarray, np.ndarray]:
    """(x_ms, share at or below x) at each bin's lower and upper edge: the histogram's CDF,
    flat across empty bins and linear within a bin (where the histogram cannot say more)."""
    low, high = bin_edges_ms(hist)
    counts = np.asarray(hist["counts"], dtype=np.float64)
    below = float(hist["below"])
    total = counts.sum() + below
    if total == 0 or counts.size == 0:
        return np.zeros(0), np.zeros(0)
    after = below + np.cumsum(counts)
    before = after - counts
    x = np.column_stack([low, high]).ravel()
    y = np.column_stack([before, after]).ravel() / total
    return x, y
