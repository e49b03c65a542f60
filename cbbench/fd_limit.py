"""The open-file limit: a server's connections and a client's connection pool each hold one file
descriptor per connection, and the default soft limit (often 1024) is below what a benchmark
opens."""

from __future__ import annotations

RESERVED_FDS = 64  # file descriptors left for everything but the connections


def raise_open_file_limit(wanted: int, reserved: int = RESERVED_FDS) -> int:
    """Raise the soft open-file limit towards the hard one (as vLLM does) so ``wanted``
    connections fit beside ``reserved`` other descriptors; returns how many connections fit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + reserved
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - reserved))


def open_file_limit() -> int | str:
    """The soft open-file limit now ("unlimited" when it has none)."""
    try:
        import resource
    except ImportError:
        return "unknown"
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return "unlimited" if soft == resource.RLIM_INFINITY else soft

