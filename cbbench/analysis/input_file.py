"""The one check every reader of a user's file makes before opening it: the path is a regular
file. A FIFO blocked `open()` until a writer came (forever), and /dev/zero never ends: both were
read as a server log or an import and hung the command. A file is what these commands take."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cbbench.errors import UsageError


def check_input_file(path: str | Path, what: str) -> None:
    """UsageError (one line) unless ``path`` is a regular file this process may open."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path} is a folder; give a file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise UsageError(f"{what} {path} is {kind}, not a file: it may never end; give a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read {what} {path}: permission denied")
