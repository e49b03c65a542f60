"""The engine's iteration records: a run keeps every one; a long-lived server keeps a bounded
window whose indices keep counting (they never repeat after old records drop)."""

from __future__ import annotations

import pytest

from cbbench.engine.core.clock import VirtualClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.feed import run_until_done
from cbbench.engine.core.request import Request
from cbbench.engine.core.scheduler import SchedulerConfig
from cbbench.engine.core.scheduler_output import ExecutorOutput


class _Millisecond:
    def execute(self, sched):
        return ExecutorOutput(sampled_token_ids=None, duration_s=1e-3)


def _engine() -> Engine:
    cfg = EngineConfig(SchedulerConfig(max_model_len=64), num_kv_blocks=16, block_size=4)
    return Engine(cfg, _Millisecond(), VirtualClock())


def test_a_run_keeps_every_record_indexed_from_zero():
    eng = _engine()
    # One request, prompt 4 and 10 outputs: one prefill step, then 9 decode steps.
    assert run_until_done(eng, [Request(0, 4, 10)])
    assert [r.index for r in eng.records] == list(range(10))
    assert eng.num_records == 10


def test_a_bounded_window_keeps_the_latest_records_and_indices_never_repeat():
    eng = _engine()
    eng.keep_recent_records(3)
    assert run_until_done(eng, [Request(0, 4, 10)])
    assert [r.index for r in eng.records] == [7, 8, 9]
    # A second burst continues the count rather than restarting it.
    assert run_until_done(eng, [Request(1, 4, 2, arrival_time=eng.clock.now())])
    assert [r.index for r in eng.records] == [9, 10, 11]
    assert eng.num_records == 12


def test_switching_to_a_window_keeps_the_most_recent_records_so_far():
    eng = _engine()
    assert run_until_done(eng, [Request(0, 4, 5)])
    eng.keep_recent_records(2)
    assert [r.index for r in eng.records] == [3, 4]
    with pytest.raises(ValueError, match="at least one"):
        eng.keep_recent_records(0)
