"""What a size needs, checked before it is allocated: a KV pool, a swap pool or a table sized by
an option that is far beyond the machine gives one line naming the option (EngineArgsError,
exit 2), never a MemoryError traceback after minutes of trying.

The estimates are of the allocations the sizes drive, not of a whole run; each says what it
counts. Memory available is read when it is needed (Linux's MemAvailable; a GPU's free
memory once the weights are loaded)."""

from __future__ import annotations

import os

from .args import EngineArgsError

# Host memory one KV block costs the allocator's bookkeeping (a free-list entry, its int, a
# share of the block tables and of the prefix cache's maps), for the simulator's pools.
BLOCK_BOOKKEEPING_BYTES = 64


def available_host_bytes() -> int | None:
    """Memory a new allocation can get on this host (None: unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} EB"


def require(what: str, need_bytes: float, available: int | None, where: str) -> None:
    """Raise EngineArgsError when ``need_bytes`` is more than ``available`` (unknown: pass).
    ``what`` names the option and what it sizes, e.g. "--num-kv-blocks 100000000 (the KV
    cache)"."""
    if available is not None and need_bytes > available:
        raise EngineArgsError(
            f"{what} needs {fmt_bytes(need_bytes)}, more than the {fmt_bytes(available)} "
            f"available {where}"
        )
