"""Another tool's file as models: each object an importer reads is a model naming the fields it
reads (as written: ``Any``, each checked where it is read, with the message that names it);
the fields it does not read pass through."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from cbbench.errors import UsageError


class ToolFields(BaseModel):
    """An object of another tool's file: the fields read of it, as written."""

    model_config = ConfigDict(extra="allow")


M = TypeVar("M", bound=ToolFields)


def part(model: type[M], v: Any, where: str, key: str, tool: str) -> M:
    """The file's object ``key`` (``v``, as written) as ``model``: absent or empty, every field
    its default; anything but an object is refused in one line naming it."""
    if not v:
        return model()
    if not isinstance(v, dict):
        raise UsageError(f"{where}: {key} holds {v!r:.40}, not an object ({tool} writes an "
                         "object there)")
    return model.model_validate(v)
