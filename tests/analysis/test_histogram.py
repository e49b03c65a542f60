"""The compact ITL histogram kept in every result: its bins hold each value within the stated
relative width, and its CDF agrees with the exact one at the bin edges."""

from __future__ import annotations

import numpy as np
import pytest

from cbbench.analysis.summary.histogram import (
    RELATIVE_WIDTH,
    bin_edges_ms,
    cdf_points,
    log_histogram,
)


def test_each_value_lies_in_its_bin_and_counts_add_up():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.lognormal(1.5, 1.0, 5000), [0.0, 0.0, 0.005]])
    hist = log_histogram(values)
    assert hist["below"] == 3  # the zero gaps and the value under 0.01 ms
    assert sum(hist["counts"]) + hist["below"] == len(values)
    low, high = bin_edges_ms(hist)
    assert np.allclose(high / low, 1 + RELATIVE_WIDTH)
    for v in values[values >= hist["low_ms"]][:200]:
        i = int(np.searchsorted(high, v, side="right"))
        assert low[i] <= v * (1 + 1e-12) and v < high[i] * (1 + 1e-12)


def test_cdf_equals_the_exact_share_at_every_bin_edge():
    rng = np.random.default_rng(1)
    values = rng.exponential(20.0, 3000)
    x, y = cdf_points(log_histogram(values))
    exact = np.array([(values < edge).mean() for edge in x])
    # At a bin edge the histogram knows the share exactly (up to values on the edge itself).
    assert y == pytest.approx(exact, abs=1e-9)
    assert y[-1] == pytest.approx(1.0)
