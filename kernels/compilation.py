"""Count Triton kernel compilations, so a run can report how many happened while it was timed.

A compilation inside a timed iteration costs from milliseconds (a disk-cache hit) to seconds
(a cold compile) and lands in that iteration's latency. Triton calls a post-compile hook each
time a kernel misses its in-memory cache (a new kernel, or a new specialization of one);
:func:`compilation_counter` installs one hook for the process and counts the calls:

    counter = compilation_counter()       # once, at start-up
    before = counter.count
    ...                                   # the timed part of the run
    compiled_during_run = counter.count - before

Hooks: ``triton.knobs.runtime.jit_post_compile_hook`` (Triton >= 3.4, including 3.6 and 3.9),
else ``JITFunction.compiled_hook`` (Triton 3.0-3.3). An existing hook is chained, not replaced.
Without Triton, or when no hook exists, ``available`` is False with a one-line ``reason``;
under ``TRITON_INTERPRET=1`` nothing compiles, so the count stays 0.
"""

from __future__ import annotations

import collections
import importlib.util
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CompilationCounter:
    available: bool
    reason: str | None = None
    count: int = 0
    by_kernel: collections.Counter = field(default_factory=collections.Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, name: str) -> None:
        with self._lock:
            self.count += 1
            self.by_kernel[name] += 1


_counter: CompilationCounter | None = None
_install_lock = threading.Lock()


def _kernel_name(kwargs: dict[str, Any]) -> str:
    fn = kwargs.get("fn")
    name = getattr(fn, "name", None) or getattr(getattr(fn, "jit_function", None), "__name__", None)
    return str(name or kwargs.get("key", "?"))


def _install(counter: CompilationCounter) -> CompilationCounter:
    if importlib.util.find_spec("triton") is None:
        counter.available, counter.reason = False, "triton is not installed"
        return counter
    try:
        import triton
    except Exception as exc:  # a broken install
        counter.available, counter.reason = False, f"triton failed to import: {exc}"
        return counter

    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is not None and hasattr(runtime, "jit_post_compile_hook"):
        owner, attr = runtime, "jit_post_compile_hook"
    else:
        from triton.runtime.jit import JITFunction

        if not hasattr(JITFunction, "compiled_hook"):
            counter.available = False
            counter.reason = f"triton {triton.__version__} has no post-compile hook"
            return counter
        owner, attr = JITFunction, "compiled_hook"
    previous = getattr(owner, attr)

    def on_compile(*args: Any, **kwargs: Any) -> Any:
        counter.record(_kernel_name(kwargs))
        return previous(*args, **kwargs) if previous is not None else None

    setattr(owner, attr, on_compile)
    counter.available = True
    if getattr(runtime, "interpret", False):
        counter.reason = "kernels run interpreted (TRITON_INTERPRET=1): nothing compiles"
    return counter


def compilation_counter() -> CompilationCounter:
    """The process's counter, installing Triton's hook on the first call (idempotent)."""
    global _counter
    with _install_lock:
        if _counter is None:
            _counter = _install(CompilationCounter(available=False))
        return _counter
