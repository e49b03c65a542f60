"""The CLI's surface: every command's flags with their defaults, as a JSON-able dict.

`test_cli_surface.py` compares it with the committed ``cli_surface.json`` so a refactor of how
the options are declared cannot drop, rename or re-default a flag. After an intended change
(a new flag), rewrite the snapshot: ``python tests/cli/cli_surface.py --write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

SNAPSHOT = Path(__file__).with_name("cli_surface.json")


def _default(p):
    d = p.default
    if callable(d):
        return "<callable>"
    if isinstance(d, (list, tuple)):
        return [str(x) for x in d]
    return d if d is None or isinstance(d, (bool, int, float, str)) else str(d)


def surface() -> dict[str, dict[str, dict]]:
    from cbbench.cli.app import app

    root = typer.main.get_command(app)
    out: dict[str, dict[str, dict]] = {}

    # Typer vendors its own click: test the shape, not the class.
    def walk(cmd, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        params = {}
        for p in cmd.params:
            argument = p.param_type_name == "argument"
            key = p.name if argument else "/".join([*p.opts, *p.secondary_opts])
            params[key] = {
                "default": _default(p),
                "required": p.required,
                "multiple": p.multiple,
                "flag": bool(getattr(p, "is_flag", False)),
                "argument": argument,
            }
        out[" ".join(path)] = params

    walk(root, [])
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        SNAPSHOT.write_text(json.dumps(surface(), indent=1, sort_keys=True) + "\n")
    else:
        print(json.dumps(surface(), indent=1, sort_keys=True))
