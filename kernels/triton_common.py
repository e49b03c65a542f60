"""What every Triton kernel module here shares: the interpreter switch, the device check, and the
one function all launches go through.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, so whether the kernels run compiled
(CUDA tensors) or interpreted (CPU tensors) is fixed when this package's Triton modules are
first imported.

Every launch goes through :func:`launch`, so tools can see the launches the engine makes
without touching the call sites: ``tests/kernels/test_triton_aot.py`` compiles them ahead of time for
sm_80/sm_90 instead of running them, and ``tests/bench/bench_kernel_count.py`` counts them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")
if INTERPRETED:
    try:
        from .triton_interpreter import (
            skip_discarded_overflow_checks,
            switch_language_once_a_launch,
        )
    except ImportError:  # no triton: nothing to interpret (availability.py says so)
        pass
    else:
        switch_language_once_a_launch()
        skip_discarded_overflow_checks()

# (kernel, grid, args, kwargs) -> None; replaces the launch while a tool intercepts launches.
LaunchHook = Callable[[Any, tuple, tuple, dict], None]
_launch_hook: LaunchHook | None = None


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def check_device(device: torch.device) -> None:
    """Raise with a one-line reason when these kernels cannot run on ``device``."""
    if _launch_hook is not None:
        return  # a tool intercepts every launch: nothing runs on the device
    if INTERPRETED and device.type != "cpu":
        raise RuntimeError("triton runs interpreted (TRITON_INTERPRET=1): it needs CPU tensors")
    if not INTERPRETED and (device.type != "cuda" or not torch.cuda.is_available()):
        raise RuntimeError("triton needs CUDA or TRITON_INTERPRET=1 with CPU tensors")


def launch(kernel: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, or the active hook's replacement for it."""
    if _launch_hook is not None:
        _launch_hook(kernel, grid, args, kwargs)
    else:
        kernel[grid](*args, **kwargs)


@contextmanager
def intercept_launches(hook: LaunchHook) -> Iterator[None]:
    """Route every launch to ``hook`` instead of the device (tooling only; not thread-safe)."""
    global _launch_hook
    previous, _launch_hook = _launch_hook, hook
    try:
        yield
    finally:
        _launch_hook = previous


def kernel_name(kernel: Any) -> str:
    """A kernel's Python name, for JITFunction and InterpretedFunction alike."""
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", repr(kernel))
