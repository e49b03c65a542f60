"""How many requests one run can hold: each costs host memory for as long as the run lasts
(its record with every token time, its engine state, its share of the iteration records), so
a count far beyond the machine is refused before anything is drawn, not after the sampling
alone has taken all the memory (`--num-requests 1000000000` reached 14 GB and counting)."""

from __future__ import annotations

from cbbench.engine.memory_check import available_host_bytes, fmt_bytes
from cbbench.errors import UsageError

# Measured: a 100,000-request simulated run peaks at ~0.9 GB (about 6 kB a request above the
# process's own); a round figure with room for longer outputs.
REQUEST_BYTES = 10_000
# A load-generator worker process (an interpreter with aiohttp, numpy and cbbench imported):
# ~59 MB each, measured with 16 local workers (issue 25).
WORKER_BYTES = 60_000_000
# A token id held in a Python tuple: the int object and the pointer to it.
TOKEN_ID_BYTES = 36


def _check_fits(needed: float, what: str, size: str) -> None:
    """UsageError when ``needed`` bytes are more than this host has available; ``size`` says
    the bytes ({} for the figure)."""
    available = available_host_bytes()
    if available is not None and needed > available:
        raise UsageError(f"{what} needs {size.format(fmt_bytes(needed))}, more than the "
                         f"{fmt_bytes(available)} available on this host")


def check_request_count(n: float, what: str) -> None:
    """UsageError when ``n`` requests need more memory than this host has available."""
    _check_fits(n * REQUEST_BYTES, what,
                f"about {{}} of memory (~{REQUEST_BYTES // 1000} kB a request)")


def check_token_ids(n: float, what: str) -> None:
    """UsageError when ``n`` token ids (made up front, as Python ints) need more memory than
    this host has available."""
    _check_fits(n * TOKEN_ID_BYTES, what, "{} of token ids")


def check_worker_count(n: int, what: str) -> None:
    """UsageError when ``n`` load-generator processes need more memory than this host has
    available (`--workers 1024` started ~60 GB of processes unchecked)."""
    _check_fits(n * WORKER_BYTES, what,
                f"about {{}} of memory (~{WORKER_BYTES // 1_000_000} MB a worker)")
