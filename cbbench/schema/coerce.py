"""A run result as its model, for the readers (report, export, calibrate, audit, replay): they
read attributes, never string keys. Their Python callers may hand in a dict still (read_run's,
or one built in memory); it is parsed here, once per call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from cbbench.schema.base import Record
from cbbench.schema.run import RUN_SCHEMA_VERSION, RunResult

M = TypeVar("M", bound=Record)


def as_model(model: type[M], value: M | Mapping[str, Any]) -> M:
    """Transitional (issue 36): a section as its model; a dict (a test's, or a caller's that
    holds the file's dict) validated into it."""
    return value if isinstance(value, model) else model.model_validate(value)


def as_run(result: RunResult | Mapping[str, Any]) -> RunResult:
    """``result`` as a RunResult. A dict's missing sections read as empty, as the readers'
    ``.get(section, {})`` read them before (a hand-made result may hold only requests)."""
    if isinstance(result, RunResult):
        return result
    return RunResult.model_validate({"schema_version": RUN_SCHEMA_VERSION, "config": {},
                                     "summary": {}, **result})
