"""During a run the collector's youngest generation is collected every RUN_GEN0_THRESHOLD
allocations, not CPython's 700 (cbbench/targets/gc_freeze.py: the collector was 16% of the
client's event-loop samples at 1,000 req/s), and the process's own thresholds come back after
the run, whether it finished or failed."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the timing server
from timing_server import timing_server  # noqa: E402

from cbbench.errors import UsageError  # noqa: E402
from cbbench.load.workload_types import WorkloadRequest  # noqa: E402
from cbbench.targets.gc_freeze import RUN_GEN0_THRESHOLD  # noqa: E402
from cbbench.targets.hooks import RunHooks  # noqa: E402
from cbbench.targets.http import EndpointOptions, run_http  # noqa: E402


@pytest.fixture(scope="module")
def server():
    with timing_server(2.0, 1.0) as url:
        yield url


@pytest.fixture
def default_thresholds():
    old = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield (700, 10, 10)
    gc.set_threshold(*old)


def test_a_run_spaces_the_collections_and_gives_them_back(server, default_thresholds):
    seen = []
    hooks = RunHooks(on_run=lambda runner: seen.append(gc.get_threshold()))
    wreqs = [WorkloadRequest(i, 2, 4, prompt=f"gc-{i}") for i in range(3)]
    run = run_http(EndpointOptions(server, served_model="timing-model"), wreqs, [0.0] * 3,
                   hooks=hooks)
    assert all(r.ok for r in run.records)
    assert seen == [(RUN_GEN0_THRESHOLD, 10, 10)]
    assert gc.get_threshold() == default_thresholds


def test_a_failed_run_gives_them_back_too(server, default_thresholds):
    def boom(runner):
        raise UsageError("stop here")

    with pytest.raises(UsageError, match="stop here"):
        run_http(EndpointOptions(server, served_model="timing-model"),
                 [WorkloadRequest(0, 2, 4, prompt="gc-x")], [0.0], hooks=RunHooks(on_run=boom))
    assert gc.get_threshold() == default_thresholds


def test_a_higher_threshold_of_the_process_is_kept():
    old = gc.get_threshold()
    gc.set_threshold(RUN_GEN0_THRESHOLD * 2, 10, 10)
    try:
        from cbbench.targets.gc_freeze import restore_collections, space_collections

        before = space_collections()
        assert gc.get_threshold()[0] == RUN_GEN0_THRESHOLD * 2
        restore_collections(before)
    finally:
        gc.set_threshold(*old)
