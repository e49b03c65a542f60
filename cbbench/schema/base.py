"""What every result-file model shares: strict types for the fields a model names (a number
where a number belongs; "12" is not 12 and true is not 1), and room for the fields it does not
name (newer producers add summary and request fields; an older reader keeps them as they are).

A record remembers the order its fields were given in, and dumps them in that order: the
model's own dump is the file, byte for byte (:func:`file_text`), so a file read and written
again, or a result built as a model and written, keeps its keys where the producer put them.

Transitional (issue 36): a record also answers ``record["key"]``, ``.get``, ``in``, ``keys``
and ``items`` as the dict it was, so readers not yet moved to attributes (and tests written
against the dict) keep working; new code reads attributes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainValidator,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cbbench.errors import UsageError


def _number(v: Any) -> int | float:
    """An int or a float as it is (a float field would read 50 as 50.0 and write it back so);
    not a bool, not a text: strict, as the rest of the schema."""
    if type(v) in (int, float) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
        return v
    raise PydanticCustomError("float_type", "Input should be a valid number")


def _amount(v: Any) -> int | float:
    n = _number(v)
    if n < 0:
        raise PydanticCustomError("greater_than_equal",
                                  "Input should be greater than or equal to 0")
    return n


# The JSON Schema says "number" as it did when this was `float`.
Number = Annotated[int | float, PlainValidator(_number), WithJsonSchema({"type": "number"})]
Amount = Annotated[int | float, PlainValidator(_amount),
                   WithJsonSchema({"type": "number", "minimum": 0})]

# One tuple per distinct key order: a million request records share a handful of them.
_ORDERS: dict[tuple[str, ...], tuple[str, ...]] = {}
_MISSING = object()


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    _order: tuple[str, ...] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        record = handler(data)
        if isinstance(data, dict) and isinstance(record, Record):
            order = tuple(data)
            record._order = _ORDERS.setdefault(order, order)
        return record

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        order = self._order if isinstance(self, Record) else None  # a dict set by hand: as is
        if order is None or not isinstance(out, dict):
            return out
        ordered = {k: out[k] for k in order if k in out}
        if len(ordered) != len(out):  # set since it was read: after the given ones
            ordered.update((k, v) for k, v in out.items() if k not in ordered)
        return ordered

    # -- the dict it was (transitional: readers not yet on attributes) --------------------

    def _present(self) -> list[str]:
        names = [k for k in type(self).model_fields if k in self.model_fields_set]
        names += list(self.__pydantic_extra__ or {})
        order = self._order
        if order is None:
            return names
        have = set(names)
        first = [k for k in order if k in have]
        return first + [k for k in names if k not in set(first)]

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        if key in type(self).model_fields:
            return getattr(self, key) if key in self.model_fields_set else default
        return (self.__pydantic_extra__ or {}).get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        """A named field takes its type where the value fits it (a dict set as the telemetry
        becomes a Telemetry); one that does not is kept as given, as a dict would keep it (a
        test writing a broken file on purpose), and the reader refuses the file."""
        if key in type(self).model_fields:
            try:
                self.__pydantic_validator__.validate_assignment(self, key, value)
                return
            except ValidationError:
                pass
        setattr(self, key, value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        if key in type(self).model_fields:  # back to unset: left out of the file
            setattr(self, key, type(self).model_fields[key].get_default(call_default_factory=True))
            self.model_fields_set.discard(key)
        else:
            extra = self.__pydantic_extra__
            if extra is not None:
                del extra[key]

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        value = self.get(key, default)
        if value is _MISSING:
            raise KeyError(key)
        if key in self:
            del self[key]
        return value

    def update(self, other: Any = (), **kw: Any) -> None:
        for key, value in dict(other, **kw).items():
            self[key] = value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def keys(self) -> list[str]:
        return self._present()

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self.get(k)) for k in self._present()]

    def values(self) -> list[Any]:
        return [self.get(k) for k in self._present()]

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]  # a dict's: its keys
        return iter(self._present())

    def __len__(self) -> int:
        return len(self._present())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):  # the dict it was: equal to the file's value
            return to_dict(self) == other
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dict


class FileHeader(BaseModel):
    """What tells a file's kind and version, as written (any JSON value: each reader checks
    them, with its own message, before the file's model reads the rest)."""

    model_config = ConfigDict(extra="ignore")

    kind: Any = None
    schema_version: Any = None


def field_of(node: object, name: str) -> Any:
    """``node``'s value at ``name`` (a model's field, named or extra, or a plain dict's key, as
    extra fields hold them), None where it has none: how a dotted metric path walks a result."""
    if isinstance(node, Record):
        if name in type(node).model_fields:  # a named field: None where the file had none
            return getattr(node, name) if name in node.model_fields_set else None
        return (node.model_extra or {}).get(name)
    if isinstance(node, dict):
        return node.get(name)
    return None


def is_empty(section: Record | dict | None) -> bool:
    """No section, or one given with no field (``{}`` in the file): the tables print such a
    section as absent."""
    if isinstance(section, Record):
        return not section.model_fields_set and not section.model_extra
    return not section


R = TypeVar("R", bound=Record)


def first_problem(e: ValidationError) -> str:
    """pydantic's first error as one phrase: 'summary.completed: Input should be a valid
    integer (got 'many')'."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "the file"
    got = err.get("input")
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    return f"{where}: {err['msg']} (got {shown[:60]})"


def validate(model: type[R], data: Any, path: object, what: str) -> R:
    """``data`` as ``model``, or one UsageError line naming the file and the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UsageError(f"{path}: not a valid {what}: {first_problem(e)}") from None


def from_built(model: type[R], data: Any, what: str) -> R:
    """A value built in memory (a producer's dicts) as ``model``, holding exactly what its
    file will: its JSON value (NaN and inf as null, tuples as lists, numpy numbers as
    numbers) validated, keys in the order the producer gave them."""
    plain = json.loads(json.dumps(json_clean(data), allow_nan=False, default=_json_number))
    return validate(model, plain, what, model.__name__)


def _json_number(v: Any) -> Any:
    """json.dumps' fallback: a numpy scalar as its Python number."""
    if hasattr(v, "item"):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON")


def to_dict(record: Record) -> dict:
    """The file's dict again: only the fields it had (none of the models' defaults added), in
    the order it had them."""
    # warnings off: a field set through the dict view to what its type refuses is written as
    # given (the file's reader refuses it), not warned about.
    return record.model_dump(mode="json", exclude_unset=True, warnings=False)


def json_clean(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    return obj


def _dump(obj: Any, indent: str) -> str:
    """Pretty at the top, one line per record: a 1000-request result stays readable and about
    half the size of fully indented JSON, and diffs line up record by record."""
    if isinstance(obj, dict) and obj and indent.count(" ") < 2:
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {_dump(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        inner = indent + " "
        rows = [inner + json.dumps(v, separators=(",", ":"), allow_nan=False) for v in obj]
        return "[\n" + ",\n".join(rows) + "\n" + indent + "]"
    return json.dumps(obj, allow_nan=False)


def dumps(data: Record | dict) -> str:
    """A result file's text (no final newline): a record's own dump, or a dict's."""
    plain = to_dict(data) if isinstance(data, Record) else data
    return _dump(json_clean(plain), "")


def file_text(data: Record | dict) -> str:
    """The whole file as written: :func:`dumps` and a newline."""
    return dumps(data) + "\n"
