"""Errors that the CLI turns into one clear line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: a flag, a file, a workload. Exit code 2, no traceback."""
