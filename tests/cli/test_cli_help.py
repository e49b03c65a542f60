"""`cbbench --help` and every `cbbench <command> --help` read like a well-kept CLI's: each help
paragraph renders as written on one line of a wide terminal (no hard break mid-sentence, no text
eaten as Rich markup or turned into an emoji), switches show no ``<bool>`` type, and the engine
options stay in their own panel."""

from __future__ import annotations

import re

import pytest
import typer
from helpers import app_command, invoke_app
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.cli.help import COLON, RICH_MIN_WIDTH, TidyCommand, TidyGroup, reflow

# Wide enough that Rich never wraps a paragraph: every line break left is in the text itself.
WIDE = {"COLUMNS": "4000"}
ENGINE_PANEL_TITLE = "─ Engine ─"


def _paragraphs(text: str) -> list[str]:
    """The help's paragraphs as a reader sees them: words single-spaced, one line each."""
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def _plain(text: str) -> str:
    """A help text as written in the source: without the escapes the tidy classes add so that
    Rich renders it literally (identity on a text they did not touch)."""
    return text.replace(COLON, ":").replace("\\[", "[")


def _invoke(root: typer.Typer, argv: list[str], env: dict[str, str]):
    """``root``'s CLI run on ``argv`` by typer's runner: cbbench's app on its click command
    built once (helpers.invoke_app; the help is rendered per call, at ``env``'s width)."""
    if root is app:
        return invoke_app(argv, env=env)
    return CliRunner(env=env).invoke(root, argv)


def _command(root: typer.Typer):
    return app_command() if root is app else typer.main.get_command(root)


def help_problems(root: typer.Typer, path: list[str]) -> list[str]:
    """What is wrong with ``root``'s help for the command at ``path``: hard breaks inside a
    paragraph, text that does not render as written, switches with a ``<bool>`` type."""
    result = _invoke(root, [*path, "--help"], WIDE)
    assert result.exit_code == 0, result.output
    out = result.output
    lines = {line.strip(" │") for line in out.splitlines()}
    where = " ".join(["cbbench", *path])
    problems = []
    if "<bool>" in out:
        problems.append(f"{where}: a switch shows a <bool> type")
    command = _command(root)
    ctx = command.make_context("cbbench", [*path, "--help"], resilient_parsing=True)
    for name in path:
        command = command.get_command(ctx, name)
        ctx = command.make_context(name, ["--help"], parent=ctx, resilient_parsing=True)
    for para in _paragraphs(_plain(command.help or "")):
        if para not in lines:
            problems.append(f"{where}: help paragraph not on one line as written: {para[:60]!r}")
    texts = [p.help for p in command.get_params(ctx) if getattr(p, "help", None)]
    for sub in getattr(command, "commands", {}).values():
        texts.append(_paragraphs(_plain(sub.help or ""))[0])  # its line in the Commands panel
    for text in texts:
        for para in _paragraphs(_plain(text)):
            if not any(para in line for line in lines):
                problems.append(f"{where}: help not on one line as written: {para[:60]!r}")
    return problems


def _all_paths() -> list[list[str]]:
    root = _command(app)
    paths = [[]]
    for name, cmd in root.commands.items():
        paths.append([name])
        paths += [[name, sub] for sub in getattr(cmd, "commands", {})]
    return paths


def test_every_help_reads_well():
    paths = _all_paths()
    assert ["run"] in paths and ["workloads", "show"] in paths and len(paths) >= 10
    problems = [p for path in paths for p in help_problems(app, path)]
    assert not problems, "\n".join(problems)


def test_engine_options_keep_their_panel():
    out = _invoke(app, ["run", "--help"], WIDE).output
    panel = out[out.index(ENGINE_PANEL_TITLE) :]
    for flag in ("--attention-backend", "--preemption", "--policy", "--kv-allocation"):
        assert flag in panel


# ---- the check itself fails on what it is meant to catch --------------------------------------
def _toy(command_cls=None, group_cls=None) -> typer.Typer:
    toy = typer.Typer(cls=group_cls) if group_cls else typer.Typer()

    @toy.callback()
    def _root() -> None:
        """A toy command line."""

    def fit(
        verbose: bool = typer.Option(False, help="Say more."),
        span: str = typer.Option("a:b", help="START:END:SECONDS, in [lo, hi]."),
    ) -> None:
        """Fit the thing to the data, reading every file and
        writing one result per input.

        Each input is read once
        and written once."""

    toy.command("fit", cls=command_cls)(fit)
    return toy


def test_the_check_catches_hard_breaks_bool_types_and_markup():
    problems = help_problems(_toy(), ["fit"])
    assert any("<bool>" in p for p in problems)
    assert any("Each input is read once" in p for p in problems)
    assert any("START:END:SECONDS" in p for p in problems)  # ':END:' rendered as an emoji
    assert any("[lo, hi]" in p for p in problems)  # eaten as a style tag
    # The group's Commands panel shows the command's first paragraph with its break.
    assert any("Fit the thing" in p for p in help_problems(_toy(), []))
    tidy = _toy(TidyCommand, TidyGroup)
    assert help_problems(tidy, ["fit"]) == [] and help_problems(tidy, []) == []


def test_reflow_keeps_paragraphs_and_verbatim_blocks():
    text = "One line\n    and its rest.\n\n    Second\n    paragraph.\n\n\b\nkept\nas is"
    assert reflow(text) == "One line and its rest.\n\nSecond paragraph.\n\n\b\nkept\nas is"


def _names(path: list[str]) -> list[str]:
    """Every option name of the command at ``path`` (positive and negative forms)."""
    command = _command(app)
    ctx = command.make_context("cbbench", [*path, "--help"], resilient_parsing=True)
    for name in path:
        command = command.get_command(ctx, name)
        ctx = command.make_context(name, ["--help"], parent=ctx, resilient_parsing=True)
    return [o for p in command.get_params(ctx) for o in (*p.opts, *p.secondary_opts)
            if o.startswith("--")]  # fmt: skip


@pytest.mark.parametrize("columns", [80, 100, RICH_MIN_WIDTH - 1, RICH_MIN_WIDTH])
def test_help_is_not_cut_on_a_narrow_terminal(columns):
    """At 80 columns (and up to where Rich's side-by-side table fits), no help is cut with
    "…", no line runs past the terminal, and every option name shows in full."""
    problems = []
    for path in _all_paths():
        result = _invoke(app, [*path, "--help"], {"COLUMNS": str(columns)})
        assert result.exit_code == 0, result.output
        out, where = result.output, " ".join(["cbbench", *path])
        if "…" in out:
            problems.append(f"{where} at {columns}: cut with …")
        if max(len(line) for line in out.splitlines()) > columns:
            problems.append(f"{where} at {columns}: a line wider than the terminal")
        problems += [f"{where} at {columns}: {n} missing" for n in _names(path) if n not in out]
    assert not problems, "\n".join(problems)


# ---- --workload names every built-in workload ------------------------------------------------
# `run --help` named four of the six built-ins `workloads list` shows, `sweep --help` and
# `capacity --help` two ("sharegpt, long-prompt"), though all six run; the help now reads the
# one list of names (load/builtin_names.py).
WORKLOAD_COMMANDS = ("run", "sweep", "capacity", "compare")


def _listed_workloads() -> list[str]:
    table = invoke_app(["workloads", "list"], env=WIDE).output.splitlines()
    return [line.split()[0] for line in table[2:] if line.strip()]  # below the header and rule


@pytest.mark.parametrize("command", WORKLOAD_COMMANDS)
def test_workload_help_names_every_listed_workload(command):
    listed = _listed_workloads()
    assert len(listed) >= 6 and "agentic-coding" in listed, listed
    text = " ".join(invoke_app([command, "--help"], env=WIDE).output.split())
    para = next(p for p in text.split("--workload")[1:] if "Built-in workload" in p)
    # A whole name: "sharegpt" inside "sharegpt-multiturn" does not count.
    missing = [name for name in listed if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", para)]
    assert not missing, (command, missing, para[:300])
    assert "random" in para


# Flags an option's help names on purpose from another command (the server's, the run that
# wrote the file): each mention says which command it belongs to.
CROSS_REFERENCES = {
    ("audit", "--request-log"), ("audit", "--save-detailed"), ("calibrate", "--engine"),
    ("run", "--enable-per-request-metrics"), ("run", "--request-log"),
}


def test_an_options_help_names_only_flags_its_command_takes():
    """`cbbench compare --help` said `--workload ... random (see --input-len), random-mm (random
    with images: --images-per-request)`: compare takes neither flag (it runs the fixed random
    lengths, and no image workload), so the flag the help sends a user to is `No such option`."""
    root = _command(app)
    wrong = []
    for path in _all_paths():
        if not path:
            continue
        command = root
        for name in path:
            command = command.commands[name]
        if hasattr(command, "commands"):
            continue
        own = {o for p in command.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
        for p in command.params:
            for flag in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", getattr(p, "help", None) or "")):
                if flag not in own and (path[-1], flag) not in CROSS_REFERENCES:
                    wrong.append((" ".join(path), p.name, flag))
    assert not wrong, wrong
