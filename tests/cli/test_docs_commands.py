"""Every `cbbench ...` command the docs show parses with the flags cbbench has today, so a flag
renamed or removed later fails here, not for a reader. Parse only (no run): the whole file
takes about a second.

A command in a ```-fenced block of docs/*.md (continuations joined, a trailing `# comment` or
`&` dropped) is complete: it must make a context (flags, their values' types, required
arguments). A command quoted inline names a command and flags in prose, often without its
arguments (`cbbench audit`) or a last flag's value (`cbbench serve --request-log`): its command
and flags must exist, and the rest must parse, required options included (a quote that gives
an argument and leaves out a required option cannot be typed as written).
`a|b` in a quoted command stands for its first choice. README.md's numbered commands are run as
written by tests/cli/test_readme_commands.py; its inline ones are checked here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import app_command

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "docs" / "examples" / "README.md"]
START = re.compile(r"^(?:\$\s*)?(?:python -m )?cbbench [a-z]")
INLINE = re.compile(r"`((?:python -m )?cbbench [a-z][^`]*)`")
FENCE = "```"


def _fenced(path: Path) -> list[tuple[str, str]]:
    out, inside, held, where = [], False, "", ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if text.startswith(FENCE):
            inside = not inside
            continue
        if not inside:
            continue
        if held:
            held += " " + text.removesuffix("\\")
        elif START.match(text):
            held, where = text.removesuffix("\\"), f"{path.relative_to(ROOT)}:{number}"
        if held and not text.endswith("\\"):
            out.append((where, held))
            held = ""
    return out


def _inline(path: Path) -> list[tuple[str, str]]:
    text = path.read_text()  # a quoted command may wrap onto the next line
    return [(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", " ".join(m.group(1).split()))
            for m in INLINE.finditer(text)]


FENCED = [c for p in DOCS for c in _fenced(p)]
QUOTED = [c for p in [*DOCS, ROOT / "README.md"] for c in _inline(p)]


def _resolve(text: str):
    """(the click command, its name path, its arguments) for a doc's command line."""
    text = re.sub(r"^\$\s*", "", text.split(" #")[0].strip()).rstrip("&").strip()
    argv = [a.split("|")[0] for a in shlex.split(text.removeprefix("python -m "))[1:] if a != "..."]
    command, path = app_command(), ["cbbench"]
    while hasattr(command, "commands"):
        assert argv and argv[0] in command.commands, f"no such command: {' '.join(path)} {argv[:1]}"
        path.append(argv[0])
        command, argv = command.commands[argv[0]], argv[1:]
    return command, " ".join(path), argv


def test_the_docs_show_commands():
    assert len(FENCED) >= 15 and len(QUOTED) >= 40, (len(FENCED), len(QUOTED))


@pytest.mark.parametrize(("where", "text"), FENCED, ids=[w for w, _ in FENCED])
def test_a_fenced_command_parses(where, text):
    command, name, argv = _resolve(text)
    command.make_context(name, argv)  # raises on an unknown flag, a bad value, a missing argument


@pytest.mark.parametrize(("where", "text"), QUOTED, ids=[w for w, _ in QUOTED])
def test_a_quoted_command_names_real_flags(where, text):
    command, name, argv = _resolve(text)
    flags = {o for p in command.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
    named = [a.split("=")[0] for a in argv if a.startswith("--")]
    if command.context_settings.get("ignore_unknown_options"):  # gate's --baseline / --new
        named = [f for f in named if f not in ("--baseline", "--new")]
    assert not [f for f in named if f not in flags], (where, text)
    try:  # what it gives must parse too; what a mention leaves out may be missing
        command.make_context(name, list(argv))  # (click consumes the list it parses)
    except Exception as e:  # Typer's vendored click: its classes are not public
        left_out_argument = type(e).__name__ == "MissingParameter" and e.param.param_type_name == "argument"
        left_out_value = type(e).__name__ == "BadOptionUsage" and argv[-1] == e.option_name
        assert left_out_argument or left_out_value, (where, text, e)
