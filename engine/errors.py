"""The one exception type for bad input, engine and front alike.

The engine cannot import the front (cbbench/), so the type lives here, at the bottom:
``EngineArgsError`` (engine/args.py) and ``cbbench.errors.UsageError`` are this class under the
names their modules have always used. Raised where the input is read (an option, a file, a
workload), it travels unchanged to the CLI, which prints it as one line, exit code 2.
"""


class InputError(ValueError):
    """Bad input from the user: one clear line, no traceback (exit code 2 in the CLI)."""
