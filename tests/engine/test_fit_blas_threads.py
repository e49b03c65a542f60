"""The calibration fit runs with one BLAS thread (engine/sim/roofline_select.fit_rates): its
matrices are small and OpenBLAS's default threads spin-wait on a busy host (5x the CPU on 2
shared cores, and a test past its 300 s timeout at load 17). scipy's OpenBLAS must be limited
too, although robust_fit imports scipy only when it first runs."""

from __future__ import annotations

import os

import pytest
from threadpoolctl import threadpool_info

from cbbench.engine.sim import roofline_select


def _blas_threads() -> dict[str, int]:
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: every pool has one thread")
def test_the_fit_sees_one_blas_thread_in_every_library(monkeypatch):
    # Undo the suite's OPENBLAS_NUM_THREADS=1 (tests/conftest.py) for this check: a user's
    # process has OpenBLAS's default.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        outside = _blas_threads()
        monkeypatch.setattr(roofline_select, "_fit_rates", lambda d, device: _blas_threads())
        inside = roofline_select.fit_rates(None, "h100")  # type: ignore[arg-type]
        after = _blas_threads()
    assert any("scipy" in path for path in inside), inside  # scipy's own OpenBLAS is loaded
    assert set(inside.values()) == {1}, inside
    assert max(outside.values()) == 2, outside
    # The limit is the fit's only: what was loaded before has its threads back.
    assert {p: after[p] for p in outside} == outside, after
