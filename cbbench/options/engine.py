"""EngineArgs (engine/args.py) as an option group: its fields, help, choices and checks are the
engine's own; every command that builds an engine takes them in the help's "Engine" panel.
The engine's seed is the command's --seed."""

from __future__ import annotations

from cbbench.engine.args import EngineArgs
from cbbench.options.fields import Group

ENGINE_PANEL = "Engine"


def engine_group(name: str = "engine_opts") -> Group:
    return Group(EngineArgs, name, panel=ENGINE_PANEL, inherit=("seed",))
