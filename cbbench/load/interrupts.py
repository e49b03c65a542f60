"""Ctrl-C, SIGTERM and SIGHUP during a run: the first stops dispatching and lets in-flight requests
finish (up to a grace period) so the result keeps what was measured; a second exits at once.
Result files are replaced atomically, so even then no half-written file is left.

Before the run starts (loading the workload, building the engine) there is nothing to keep:
a signal then exits at once. The run "starts" when its loop first asks whether to stop; a
signal before that raises KeyboardInterrupt, which also breaks a blocking read (a FIFO with no
writer as the workload ignored SIGTERM until SIGKILL)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

DEFAULT_GRACE_S = 10.0


# SIGHUP (the terminal closed, an ssh session dropped) stops a run as SIGTERM does: it killed
# an endpoint run with nothing written.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, n))


class StopSignal:
    def __init__(self) -> None:
        self._stop = threading.Event()
        self._previous: dict[int, Any] = {}  # what signal.signal returned
        self._started = False

    def __call__(self) -> bool:
        self._started = True  # the run's loop asks: from now on a signal stops it gracefully
        return self._stop.is_set()

    def _handle(self, signum, frame) -> None:
        if self._stop.is_set() or not self._started:
            # Second signal: leave now. KeyboardInterrupt unwinds to the CLI's exit code 130.
            raise KeyboardInterrupt
        self._stop.set()
        name = signal.Signals(signum).name
        try:
            print(
                f"cbbench: {name}: stopping; finishing in-flight requests and writing the result "
                "(press Ctrl-C again to quit now)",
                file=sys.stderr,
                flush=True,
            )
        except (OSError, ValueError):  # the terminal is gone (SIGHUP): the result still counts
            pass

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
