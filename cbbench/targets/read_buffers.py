"""Network reads without a memory-mapping system call each: the client's read buffers come
from the heap (glibc's malloc), never from mmap.

asyncio's selector transport reads every socket with `sock.recv(256 KiB)`: each read allocates
a 256 KiB bytes object, and shrinks it to the few hundred bytes that arrived (a token event).
glibc serves an allocation above its mmap threshold with a fresh mmap, the shrink with mremap,
the free with munmap: three system calls and two page faults on every network read (~35 us
here, ~5 reads per streamed request: +25-30% of the client's CPU per request at 500 req/s).
The threshold starts at 128 KiB, and glibc raises it only after the process frees an mmapped
block larger than it, so whether a client paid depended on what its process happened to
allocate and free before the run: in the side-by-side harness 8169f12's client paid in every
run, 6a0ec45's in 1 of 4 (results/loadgen_capacity.md). Setting the thresholds before the run
makes it the same for every process: a block up to MMAP_THRESHOLD_BYTES comes from the heap,
and the heap's top goes back to the system only past TRIM_THRESHOLD_BYTES (twice, as glibc's
own rule has it), so a read's buffer is a reused piece of the heap. Process-wide, and kept
after the run (glibc has no call to read the old values back): what glibc does by itself once
the process frees a large block.

glibc only: elsewhere (macOS, musl) `keep_reads_on_heap` does nothing and returns False. Under
uvloop (Ray's actors) a read allocates only what arrived, so there is nothing to keep.
"""

from __future__ import annotations

import ctypes
import sys

# glibc's malloc.h parameter numbers for mallopt().
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Above asyncio's 256 KiB read buffer (selector_events._SelectorTransport.max_size) with room
# to spare; glibc caps the threshold at 32 MiB on 64-bit.
MMAP_THRESHOLD_BYTES = 1 << 20
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES


def _libc_mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the interpreter's own symbols, libc's among them
        # gnu_get_libc_version: glibc's own (musl has a mallopt that does nothing).
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError off glibc
        return libc.mallopt
    except (OSError, AttributeError):
        return None


def keep_reads_on_heap() -> bool:
    """Set glibc's mmap and trim thresholds (see the module's docstring); True when set."""
    mallopt = _libc_mallopt()
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; the trim threshold first, as glibc's own rule moves both.
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    )
