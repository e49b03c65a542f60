"""schema.base writes NaN and infinities as null: from_built and dumps try the C encoder on the
data as given and clean it in Python only where the encoder refuses a value. Both paths give
what cleaning everything first gave: the same bytes and the same validated values."""

from __future__ import annotations

import json

import numpy as np

from cbbench.schema.base import Record, _dump, dumps, from_built, json_clean, to_dict


class _Doc(Record):
    pass


def _cleaned_first(data):
    """What from_built validated and dumps wrote when every value was cleaned first."""
    return json.loads(json.dumps(json_clean(data), allow_nan=False, default=lambda v: v.item()))


CLEAN = {
    "kind": "run",
    "requests": ({"id": 1, "t": (0.5, 1.0)}, {"id": 2, "t": [2]}),
    "summary": {"n": np.int64(3), "x": np.float64(0.25), "rows": [{"a": 1}]},
}
DIRTY = {
    "kind": "run",
    "requests": ({"id": 1, "t": (0.5, float("nan"))}, {"id": 2}),
    "summary": {"x": float("inf"), "y": -float("inf"), "rows": ({"a": float("nan")},)},
}


def test_from_built_holds_what_cleaning_first_held():
    for data in (CLEAN, DIRTY):
        doc = from_built(_Doc, data, "a test document")
        assert to_dict(doc) == _cleaned_first(data)
    assert to_dict(from_built(_Doc, DIRTY, "x"))["summary"]["x"] is None


def test_dumps_writes_the_bytes_cleaning_first_wrote():
    for data in (CLEAN, DIRTY):
        plain = {k: v for k, v in data.items() if k != "summary"} | {"summary": {"rows": [1]}}
        assert dumps(plain) == _dump(json_clean(plain), "")
    dirty = {"kind": "run", "requests": DIRTY["requests"], "summary": {"x": float("nan")}}
    text = dumps(dirty)
    assert text == _dump(json_clean(dirty), "")
    assert json.loads(text)["requests"][0]["t"] == [0.5, None]
    # a tuple of records is written one record a line, as the list it becomes
    assert (
        dumps({"requests": ({"id": 1}, {"id": 2})})
        == '{\n "requests": [\n  {"id":1},\n  {"id":2}\n ]\n}'
    )
