"""Bad input: one exception type for the front and the engine, printed by the CLI as one line
(`cbbench: error: ...`) and exit code 2.

It is the engine's InputError (cbbench/engine/errors.py: the engine cannot import the front),
so an engine option refused deep in a build reaches the CLI as it was raised, with no
translation on the way."""

from cbbench.engine.errors import InputError as UsageError

__all__ = ["UsageError"]
