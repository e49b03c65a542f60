"""Stand-ins for the CUDA graph tests, shared by the CUDA test and the CPU test that keeps it
honest (tests/engine/test_graph_capture_cpu.py).

``syncing_graph_body`` replaces ``ModelRunner._graph_body``: it runs the real body, then calls
``sync`` (on a GPU, ``torch.cuda.current_stream().synchronize()``: illegal while capturing, so
the capture fails on purpose). Its signature must accept what ``GraphLadder.capture`` passes,
``body(size, piece)`` on the bound method; a stand-in that did not would die with a TypeError
in warm-up, before any capture, and a "capture failed" test would pass without one failing.
"""

from __future__ import annotations

from collections.abc import Callable


def syncing_graph_body(real_body: Callable, sync: Callable[[], None]) -> Callable:
    """A ``_graph_body`` (self, bs, piece=0) that runs ``real_body`` and then ``sync()``."""

    def body(self, bs: int, piece: int = 0) -> None:
        real_body(self, bs, piece)
        sync()

    return body
