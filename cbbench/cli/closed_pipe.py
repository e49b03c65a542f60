"""stdout whose reader went away (`cbbench run | head -1`): the printout stops, the command
does not.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError wherever it lands:
in the middle of a capacity search's table, before its capacity.json was written (the file was
lost), or in a write that a command let go, whose bytes stayed buffered until the
interpreter's last flush printed "Exception ignored ... BrokenPipeError" and exited 120.
Here the first such write points stdout at /dev/null, so every later write and flush
succeeds, and the command goes on to write its files. The exit is then at least 1, Python's
convention for EPIPE (docs: signal, "Note on SIGPIPE"): the printout did not all arrive."""

from __future__ import annotations

import os
import sys
from typing import TextIO, cast

READER_GONE_EXIT = 1


class ClosedPipeStdout:
    """sys.stdout, with a closed pipe turned into /dev/null (everything else as the stream's)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()
            self._stream.flush()  # the bytes left in the buffer, now to /dev/null

    def _to_devnull(self) -> None:
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def install() -> ClosedPipeStdout | None:
    """Wrap sys.stdout when it is a real file descriptor (not a test's capture)."""
    try:
        sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    wrapped = ClosedPipeStdout(sys.stdout)
    sys.stdout = cast(TextIO, wrapped)
    return wrapped


def exit_code(code: int, wrapped: ClosedPipeStdout | None) -> int:
    """The command's code; at least READER_GONE_EXIT when stdout's reader went away, and the
    buffer's last bytes sent to /dev/null if that happened only now."""
    if wrapped is None:
        return code
    try:
        wrapped.flush()
    except OSError:  # not a pipe: a full disk (/dev/full) says so where it is written
        pass
    return code or READER_GONE_EXIT if wrapped.reader_gone else code
