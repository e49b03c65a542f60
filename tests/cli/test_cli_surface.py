"""Every command keeps exactly its flags and their defaults (issue 23: the option groups in
cbbench/options/ generate them; the names users and CI scripts type must not move)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cli_surface import SNAPSHOT, surface  # noqa: E402


def test_every_command_keeps_its_flags_and_defaults():
    want = json.loads(SNAPSHOT.read_text())
    got = json.loads(json.dumps(surface(), sort_keys=True))
    assert sorted(got) == sorted(want), "commands added or gone"
    problems = []
    for command, flags in want.items():
        have = got[command]
        for flag in sorted(set(flags) - set(have)):
            problems.append(f"{command}: {flag} is gone")
        for flag in sorted(set(have) - set(flags)):
            problems.append(f"{command}: {flag} is new (intended? python tests/cli/cli_surface.py --write)")
        for flag in sorted(set(flags) & set(have)):
            if flags[flag] != have[flag]:
                problems.append(f"{command}: {flag} was {flags[flag]}, now {have[flag]}")
    assert not problems, "\n".join(problems)


def test_run_help_lists_every_flag():
    """`cbbench run --help` shows each of them (the test above reads the parser; this, the text)."""
    from typer.testing import CliRunner

    from cbbench.cli.app import app

    out = CliRunner(env={"COLUMNS": "4000"}).invoke(app, ["run", "--help"]).output
    flags = json.loads(SNAPSHOT.read_text())["run"]
    missing = [f for f in flags if f.split("/")[0] not in out]
    assert flags and not missing, missing
