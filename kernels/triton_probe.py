"""Can a Triton kernel actually launch here? One tiny kernel, launched once per device.

Importing Triton proves little: its first launch on a GPU builds a small C launcher, which
needs a C compiler and Python's headers, and then loads the cubin through the driver. A machine
missing any of them imports Triton fine and fails at the first kernel, in the middle of a run.
``auto`` backend selection and ``get_backend("triton")`` ask :func:`launch_failure` first.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

PROBE_VALUE = 7


@triton.jit
def _probe_kernel(out_ptr, value):
    tl.store(out_ptr + tl.arange(0, 1), tl.full([1], value, tl.int32))


def _launch_probe(device: torch.device) -> int:
    out = torch.zeros(1, dtype=torch.int32, device=device)
    _probe_kernel[(1,)](out, PROBE_VALUE)  # a real launch: never intercepted
    return int(out.item())  # one sync, once per device per process


@functools.cache
def launch_failure(device: torch.device) -> str | None:
    """``None`` when the probe kernel ran and wrote its value, else a one-line reason."""
    try:
        got = _launch_probe(device)
    except Exception as exc:  # compiler, launcher, driver, out of memory: all mean "cannot"
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"a Triton kernel cannot launch on {device}: {type(exc).__name__}: {first_line}"
    if got != PROBE_VALUE:
        return f"a Triton probe kernel on {device} wrote {got}, expected {PROBE_VALUE}"
    return None
