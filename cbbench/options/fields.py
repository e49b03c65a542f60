"""Option groups as typed dataclasses, and the Typer flags derived from them.

The pattern is EngineArgs' (engine/args.py): a field carries its type, default, help and checks
(choices, a range) in its metadata; the CLI derives each command's flags from the fields, so an
option is declared once however many commands take it; ``validate()`` checks a group in one
place and raises UsageError naming the flag.

Field metadata (all optional, set through :func:`opt`): ``help``; ``choices``; ``low``/``high``
with ``low_open`` (a range; checked by :func:`check_fields`); ``flag`` (the flag when it is not
the field name, e.g. ``--json``); ``switch`` (False: a bool flag without a ``--no-`` form);
``panel`` (the help panel); ``parser`` and ``metavar`` (passed to Typer); ``cli`` (False: no
flag); ``given_of`` (a bool field, no flag, that Group.build sets to whether the command's flag
of that name was given: see :func:`given`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer

from cbbench.engine.args import flag_of, range_text
from cbbench.errors import UsageError

REQUIRED = inspect.Parameter.empty  # an override's default that makes a flag required


def opt(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field carrying its flag's help and checks in its metadata."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class FieldMeta:
    """A field's metadata (the module docstring's keys, as :func:`opt` or EngineArgs' own
    ``opt`` set them), typed; a key not set keeps its default."""

    help: str = ""
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    flag: str | None = None
    switch: bool = True
    panel: str | None = None
    parser: Callable[[str], Any] | None = None
    metavar: str | None = None
    cli: bool = True  # False: set by the code, never a flag
    # A bool field (cli False) that Group.build sets: whether the flag of the field named here
    # was given (its source, not its value: an explicit default is given).
    given_of: str | None = None

    @classmethod
    def of(cls, f: dataclasses.Field) -> FieldMeta:
        given = f.metadata
        return cls(**{k.name: given[k.name] for k in dataclasses.fields(cls) if k.name in given})


def flag_name(f: dataclasses.Field) -> str:
    return FieldMeta.of(f).flag or flag_of(f.name)


def check_fields(group: Any) -> None:
    """The first field of ``group`` outside its choices or range, as a UsageError."""
    for f in dataclasses.fields(group):
        value, meta = getattr(group, f.name), FieldMeta.of(f)
        if value is None or isinstance(value, bool):
            continue
        choices = meta.choices
        if choices is not None and value not in choices:
            raise UsageError(f"{flag_name(f)} must be one of {', '.join(choices)}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag_name(f)} must be a finite number, got {value}")
        low, high, low_open = meta.low, meta.high, meta.low_open
        if isinstance(value, (int, float)) and (
            (low is not None and (value <= low if low_open else value < low))
            or (high is not None and value > high)
        ):
            raise UsageError(f"{flag_name(f)} must be {range_text(low, high, low_open)}, got {value}")


@dataclass(frozen=True)
class Group:
    """How a command takes an option group: which of its fields (default: all), with which
    defaults or help changed for this command, and a prefix for every help text (compare's
    ``--variants:``). The command receives the group as the keyword ``name``."""

    cls: type
    name: str
    only: tuple[str, ...] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    help: Mapping[str, str] = field(default_factory=dict)
    help_prefix: str = ""
    panel: str | None = None  # every flag of the group in this help panel
    inherit: tuple[str, ...] = ()  # fields set from another group's flag of that name (seed)

    def fields(self) -> list[dataclasses.Field]:
        every = [f for f in dataclasses.fields(self.cls) if FieldMeta.of(f).cli]
        if self.only is None:
            return every
        by_name = {f.name: f for f in every}
        return [by_name[n] for n in self.only]

    def parameters(self) -> list[inspect.Parameter]:
        hints = typing.get_type_hints(self.cls)
        return [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, annotation=self._annotation(f, hints[f.name]),
                default=self.defaults.get(f.name, _default(f)),
            )
            for f in self.fields()
        ]

    def _annotation(self, f: dataclasses.Field, hint: Any) -> Any:
        meta = FieldMeta.of(f)
        flag = flag_name(f)
        if hint is bool and meta.switch:
            decls: tuple[str, ...] = (f"{flag}/--no-{flag[2:]}",)
        else:
            decls = (flag,)
        help_text = self.help_prefix + self.help.get(f.name, meta.help)
        option = typer.Option(
            *decls,
            help=help_text,
            # a field's own panel over the group's
            rich_help_panel=meta.panel if meta.panel is not None else self.panel,
            parser=meta.parser,
            metavar=meta.metavar if meta.metavar is not None
            else "|".join(meta.choices) if meta.choices else None,
        )
        return Annotated[hint, option]

    def build(self, values: dict[str, Any], given: Mapping[str, Any]) -> Any:
        """The group from a command's parsed values (fields the command does not take keep
        their defaults; ``inherit`` ones come from ``given``, every value as parsed), validated.
        """
        mine = {f.name: values.pop(f.name) for f in self.fields()}
        mine.update({name: given[name] for name in self.inherit})
        on_command_line = given_on_command_line(mine)
        # Fields that record whether a flag this command takes was given (given_of).
        for f in dataclasses.fields(self.cls):
            of = FieldMeta.of(f).given_of
            if of is not None and of in mine:
                mine[f.name] = of in on_command_line
        group = self.cls(**mine)
        group.validate()
        # A group that refuses a flag given where it does nothing (even at its default value,
        # which validate() cannot tell from no flag) learns which of its flags were given.
        validate_given = getattr(group, "validate_given", None)
        if validate_given is not None:
            validate_given(on_command_line)
        return group


def given(name: str) -> bool:
    """Whether the running command's option ``name`` was given (on the command line or the
    environment), not left at its default: a default cannot say so by its value. False outside
    a command (a direct call)."""
    try:  # Typer 0.2x runs commands on its own copy of Click
        from typer._click.globals import get_current_context
    except ImportError:  # the same function from Click itself (a different module to mypy)
        from click import get_current_context  # type: ignore[no-redef]

    ctx = get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def given_on_command_line(names) -> frozenset[str]:
    """Which of the running command's parameters ``names`` were given (see `given`)."""
    return frozenset(name for name in names if given(name))


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else REQUIRED


def with_options(*groups: Group):
    """Give a command the flags of ``groups``: Typer sees them in the signature (after the
    command's own), and the command receives each group built and validated, as the keyword
    the Group names."""

    def decorate(fn):
        own = [p for name, p in inspect.signature(fn, eval_str=True).parameters.items()
               if name not in {g.name for g in groups}]
        extra = [p for g in groups for p in g.parameters()]

        @functools.wraps(fn)
        def wrapper(**kwargs):
            given = dict(kwargs)
            for g in groups:
                kwargs[g.name] = g.build(kwargs, given)
            return fn(**kwargs)

        params = own + extra
        wrapper.__signature__ = inspect.Signature(params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
