"""The event loop a client run's requests go through: uvloop (libuv, in C) where it is
installed, else asyncio's own.

Each streamed request costs the client one network read per token event; under asyncio's
selector loop every read is a Python-level `_run_once` pass, a handle, a `recv` of a 256 KiB
buffer (read_buffers.py) and a `data_received` call, under uvloop only the last is Python.
Side by side at 1,000 req/s of 16-token streams uvloop took the client from 508 to 346 us of
CPU per request (f5e98e5: 977; measured on a loaded machine, results/loadgen_rust_parity.md
has the benchmark). Timers keep their meaning: uvloop rounds them to whole
milliseconds, and client_health.sleep_until never returns before its deadline under either.

`CBBENCH_CLIENT_LOOP=asyncio` runs the standard loop instead (the side-by-side benchmark
measures both; a platform whose uvloop misbehaves can opt out).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
LOOP_ENV = "CBBENCH_CLIENT_LOOP"  # "asyncio": the standard loop; anything else: uvloop if any


def loop_name() -> str:
    """The loop run_client uses here: "uvloop" or "asyncio"."""
    if os.environ.get(LOOP_ENV, "").strip().lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_client(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro) on the client's loop (see the module's docstring)."""
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)
