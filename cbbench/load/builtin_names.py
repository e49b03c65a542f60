"""The built-in workloads' names, the one list every command's --workload help reads (so the
help cannot fall behind `cbbench workloads list` again: it named four of six for `run` and two
for `sweep` and `capacity`). Kept apart from load/workload.py, which builds them, because the
help is rendered without numpy (tests/cli/test_cli_import_set.py); load/workload.py's
BUILTIN_WORKLOADS holds a builder for each name (tests/load/test_workload.py checks both agree).
"""

from __future__ import annotations

BUILTIN_NAMES = ("agentic-coding", "calibration", "long-prompt", "shared-prefix", "sharegpt",
                 "sharegpt-multiturn")


def listed() -> str:
    """The names as the help lists them: "agentic-coding, calibration, ..."."""
    return ", ".join(BUILTIN_NAMES)
