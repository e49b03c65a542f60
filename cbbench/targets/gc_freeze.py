"""The garbage collector during a run: the heap from before the run is frozen, out of the
collector's sight, so its collections stall the event loop only for the run's own objects.

A CPython collection stops the event loop while it walks the generations it collects, and a
full one walks every tracked object of the process: mostly what was made before the run (the
modules, aiohttp, the workload and its prompts). At 500 requests/s a 40 ms stall sends ~20
requests late and reads their tokens late: it is the client's own error in the send lag and
TTFT tails. `gc.freeze()` before the clock starts moves those objects to the permanent
generation no collection walks; the run's own objects (its records, the requests in flight)
are collected as usual. `thaw_heap` puts them back when the run ends, so garbage frozen with
them is collected then. (No collection before freezing: in a large process, a test runner
with torch imported, one takes ~100 ms, and freezing is instant.)
"""

from __future__ import annotations

import gc

# The youngest generation's threshold during a run (CPython's default: 700). A collection then
# walks at most about this many young objects: ~1 ms, a few times a second at 1,000 req/s.
RUN_GEN0_THRESHOLD = 20_000


def freeze_heap() -> bool:
    """Freeze every tracked object. False (and nothing done) when something else has frozen
    objects already: that arrangement is the caller's, not ours to undo."""
    if gc.get_freeze_count():
        return False
    gc.freeze()
    return True


def thaw_heap(frozen: bool) -> None:
    """Undo freeze_heap (the frozen objects become collectable again)."""
    if frozen:
        gc.unfreeze()


def space_collections() -> tuple[int, ...]:
    """Collect the youngest generation every RUN_GEN0_THRESHOLD allocations (see the module's
    docstring); returns the thresholds before, for restore_collections. A process whose
    threshold is already higher (or 0: automatic collection off) keeps its own."""
    old = gc.get_threshold()
    if 0 < old[0] < RUN_GEN0_THRESHOLD:
        gc.set_threshold(RUN_GEN0_THRESHOLD, *old[1:])
    return old


def restore_collections(old: tuple[int, ...]) -> None:
    gc.set_threshold(*old)
