"""What every result-file model shares: strict types for the fields a model names (a number
where a number belongs; "12" is not 12 and true is not 1), and room for the fields it does not
name (newer producers add summary and request fields; an older reader keeps them as they are)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from cbbench.errors import UsageError

Number = float  # strict mode still takes an int where a float is declared


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


def first_problem(e: ValidationError) -> str:
    """pydantic's first error as one phrase: 'summary.completed: Input should be a valid
    integer (got 'many')'."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "the file"
    got = err.get("input")
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    return f"{where}: {err['msg']} (got {shown[:60]})"


def validate(model: type[Record], data: Any, path: object, what: str) -> Record:
    """``data`` as ``model``, or one UsageError line naming the file and the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UsageError(f"{path}: not a valid {what}: {first_problem(e)}") from None


def to_dict(record: Record) -> dict:
    """The file's dict again: only the fields it had (none of the models' defaults added)."""
    return record.model_dump(mode="json", exclude_unset=True)
