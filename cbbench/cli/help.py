"""Help that reads like a well-kept CLI's.

Typer renders help texts as Rich markup with their source line breaks kept, and gives every
on/off switch a ``<bool>`` type column. So a docstring wrapped at 95 columns wrapped again
mid-sentence in the terminal, ``[len*(1-R), len*(1+R)]`` vanished as an unknown style tag, and
``START:END:SECONDS`` showed an emoji for ``:END:``. The command and group classes here reflow
each help paragraph into one line (the terminal wraps it), make the text render exactly as
written, and leave a switch's type column empty: a flag takes no value.

Typer's option table sets names, negative names, type and help side by side; below
RICH_MIN_WIDTH columns (measured: `run`, `compare`, `serve`, `sweep` and `capacity` need 120)
it cuts names and words with "…". There the help is laid out as click does it instead: each
panel a section, a long name on its own line, its help wrapped below, nothing cut.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, overload

from typer.core import TyperCommand, TyperGroup

from cbbench.cli.boundary import CommandBoundary, GroupBoundary

if TYPE_CHECKING:
    # The mixin's base for the type checker: the command class that Typer's command and group
    # classes both derive from (Typer vendors click as typer._click). At run time the mixin
    # stays a plain class, placed before Typer's in each subclass's bases.
    from typer._click.core import Command as _CommandBase
else:
    _CommandBase = object

PARAGRAPH = "\n\n"
# Click's marker for a paragraph that keeps its line breaks (a list, a table).
VERBATIM = "\b"
RICH = "rich"
# An empty span after each colon: Rich replaces :name: emoji codes only within one span of text.
COLON = ":[none][/none]"
TIDIED = "_cbbench_tidied"
HELP_TIDIED = "_cbbench_help_tidied"
RICH_MIN_WIDTH = 120
MIN_TEXT_WIDTH = 40
# The characters Rich's markup escape acts on: a "[" opening a tag, a backslash before one or
# at the end.
MARKUP_CHARS = frozenset("[\\")


@overload
def reflow(text: str) -> str: ...
@overload
def reflow(text: None) -> None: ...
def reflow(text: str | None) -> str | None:
    """Each paragraph of ``text`` on one line; paragraphs stay apart, verbatim ones untouched."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split(PARAGRAPH)
    return PARAGRAPH.join(
        p if p.startswith(VERBATIM) else " ".join(p.split()) for p in paragraphs
    )


@overload
def literal(text: str) -> str: ...
@overload
def literal(text: None) -> None: ...
def literal(text: str | None) -> str | None:
    """``text`` as Rich markup that renders exactly as written (no style tags, no emoji)."""
    if not text:
        return text
    if MARKUP_CHARS.intersection(text):
        # Imported here: Rich's escape changes only a "[" tag or a trailing backslash, and most
        # texts have neither; `cbbench run` then starts without importing Rich (~30 ms of CPU,
        # it draws nothing off a terminal).
        from rich.markup import escape

        text = escape(text)
    return text.replace(":", COLON)


@overload
def plain(text: str) -> str: ...
@overload
def plain(text: None) -> None: ...
def plain(text: str | None) -> str | None:
    """The inverse of :func:`literal`: the text as written, for a renderer without markup."""
    return text.replace(COLON, ":").replace("\\[", "[") if text else text


def terminal_width() -> int:
    """The width Typer's Rich console renders help at (TERMINAL_WIDTH, COLUMNS, the tty)."""
    from rich.console import Console
    from typer import rich_utils

    return Console(width=rich_utils.MAX_WIDTH).width


def is_switch(param) -> bool:
    """An option that takes no value (Typer vendors its own click, so test by attribute)."""
    return bool(getattr(param, "is_flag", False))


class _Tidy(_CommandBase):
    """Mixed into Typer's command and group classes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._rich = getattr(self, "rich_markup_mode", None) == RICH
        self.help = self._text(self.help)
        self.short_help = self._text(self.short_help)

    def _text(self, text: str | None) -> str | None:
        text = reflow(text)
        return literal(text) if self._rich else text

    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)  # includes --help, made on demand
        for param in params:
            if getattr(param, TIDIED, False):  # called on every parse and help render: once
                continue
            setattr(param, TIDIED, True)
            if is_switch(param):
                param.metavar = ""  # Typer shows the metavar in the type column
        return params

    def _tidy_param_help(self, ctx) -> None:
        """Each parameter's help reflowed, as Rich markup that renders as written. Only the
        help reads it, so a parse (which also asks get_params) does not pay for it: a
        parameter help with a "[" tag needs Rich's escape, and `cbbench run` off a terminal
        then never imports Rich."""
        for param in self.get_params(ctx):
            if getattr(param, HELP_TIDIED, False):
                continue
            setattr(param, HELP_TIDIED, True)
            # Options and Typer's arguments have a help; click's Parameter declares none, so
            # the type checker sees no attribute: set it as it was read, by name.
            text = getattr(param, "help", None)
            if text:
                setattr(param, "help", self._text(text))  # noqa: B010

    def format_help(self, ctx, formatter) -> None:
        self._tidy_param_help(ctx)
        if not self._rich or terminal_width() >= RICH_MIN_WIDTH:
            return super().format_help(ctx, formatter)
        return narrow_help(self, ctx, formatter)


def narrow_help(command, ctx, formatter) -> None:
    """Click's layout for ``command``'s help, sections named after Typer's panels."""
    formatter.width = max(terminal_width() - 2, MIN_TEXT_WIDTH)
    command.format_usage(ctx, formatter)
    if command.help:
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(plain(command.help))
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        default = "Arguments" if param.param_type_name == "argument" else "Options"
        panel = getattr(param, "rich_help_panel", None) or default
        panels.setdefault(panel, []).append((record[0], plain(record[1])))
    for name, rows in panels.items():
        with formatter.section(name):
            formatter.write_dl(rows)
    commands = []
    for name in getattr(command, "commands", {}):
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            first = plain(sub.short_help or sub.help or "").split(PARAGRAPH)[0]
            commands.append((name, " ".join(first.split())))
    if commands:
        with formatter.section("Commands"):
            formatter.write_dl(commands)


class TidyCommand(CommandBoundary, _Tidy, TyperCommand):
    pass


class TidyGroup(GroupBoundary, _Tidy, TyperGroup):
    pass


def tidy_commands(app) -> None:
    """Give every command registered on the Typer ``app`` so far the tidy class (Typer's
    default command class otherwise)."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = TidyCommand
