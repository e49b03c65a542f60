"""What every result-file model shares: strict types for the fields a model names (a number
where a number belongs; "12" is not 12 and true is not 1), and room for the fields it does not
name (newer producers add summary and request fields; an older reader keeps them as they are).

A record remembers the order its fields were given in, and dumps them in that order: the
model's own dump is the file, byte for byte (:func:`file_text`), so a file read and written
again, or a result built as a model and written, keeps its keys where the producer put them.

A record is read by its attributes; :func:`to_dict` gives the file's dict where one is
wanted (a test that tampers with the file's JSON).
"""

from __future__ import annotations

import json
import math
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


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)

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
    # One trip through the C encoder and decoder: NaN and inf written as JSON's constants and
    # read back as null is what json_clean gives, without a Python call per value (a run's
    # records hold millions; this was most of the cost of building a result).
    plain = json.loads(json.dumps(data, default=_json_number), parse_constant=_null)
    return validate(model, plain, what, model.__name__)


def _null(_constant: str) -> None:
    """json.loads' reading of NaN, Infinity and -Infinity: null, as json_clean writes them."""
    return None


def _json_number(v: Any) -> Any:
    """json.dumps' fallback: a numpy scalar as its Python number (a finite one: a numpy float32
    NaN or inf is refused, as it was before the C round trip)."""
    if hasattr(v, "item"):
        value = v.item()
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("Out of range float values are not JSON compliant")
        return value
    raise TypeError(f"{type(v).__name__} is not JSON")


def to_dict(record: Record) -> dict:
    """The file's dict again: only the fields it had (none of the models' defaults added), in
    the order it had them."""
    # warnings off: a field set by hand to what its type refuses (a test writing a broken
    # file on purpose) is written as given (the file's reader refuses it), not warned about.
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
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], dict):
        inner = indent + " "
        rows = [inner + json.dumps(v, separators=(",", ":"), allow_nan=False) for v in obj]
        return "[\n" + ",\n".join(rows) + "\n" + indent + "]"
    return json.dumps(obj, allow_nan=False)


def dumps(data: Record | dict) -> str:
    """A result file's text (no final newline): a record's own dump, or a dict's."""
    plain = to_dict(data) if isinstance(data, Record) else data
    try:  # json.dumps refuses a NaN or an infinity (allow_nan=False): none, nothing to clean
        return _dump(plain, "")
    except ValueError:
        return _dump(json_clean(plain), "")


def file_text(data: Record | dict) -> str:
    """The whole file as written: :func:`dumps` and a newline."""
    return dumps(data) + "\n"
