"""pyproject.toml's lower bounds are versions that work: an install at every direct dependency's
declared floor (`uv pip install --resolution lowest-direct`) must run the CLI and the suite.

Each floor below names the API that sets it; the bound there was found too low by such an
install, which failed without the raise."""

from __future__ import annotations

import re

from test_import_graph import ROOT

# name: (the first version that works, the API that needs it)
FLOORS = {
    # Click 8.2 (the one a resolver installs) dropped Parameter.make_metavar()'s default ctx:
    # typer 0.12.4-0.15.3 crash on every --help; 0.12.0-0.12.3 refuse `int | None` options.
    "typer": ((0, 16), "typer's Click 8.2 support"),
    "transformers": ((4, 52), "transformers.utils.chat_template_utils.render_jinja_template"),
}


def declared_floors() -> dict[str, tuple[int, ...]]:
    text = (ROOT / "pyproject.toml").read_text()
    return {name.lower(): tuple(int(p) for p in version.split("."))
            for name, version in re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)', text)}


def test_each_declared_floor_provides_the_api_the_code_uses():
    declared = declared_floors()
    too_low = [f"{name}>={'.'.join(map(str, declared.get(name, ())))} (needs "
               f"{'.'.join(map(str, floor))}: {api})"
               for name, (floor, api) in FLOORS.items() if declared.get(name, ()) < floor]
    assert not too_low, "raise in pyproject.toml: " + "; ".join(too_low)
