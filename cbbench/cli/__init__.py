"""The `cbbench` command line.

Ctrl-C while the command is still importing (a second or more: numpy, torch) used to end in a
KeyboardInterrupt traceback, raised before app.main's own handling exists; the hook below
prints the one line main prints for it instead. It only sees exceptions nothing caught, and
passes every other one on.
"""

import sys

_previous_hook = sys.excepthook


def _quiet_interrupt(kind, value, tb) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print("cbbench: interrupted", file=sys.stderr)
        return
    _previous_hook(kind, value, tb)


sys.excepthook = _quiet_interrupt
