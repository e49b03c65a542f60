"""EngineArgs is the one source of the engine options: the CLI's options of every command that
builds an engine are derived from it, and every bad value is rejected before anything runs."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.engine.args import ATTENTION_BACKENDS, EngineArgs, EngineArgsError, field_flag

runner = CliRunner()
ENGINE_COMMANDS = ("run", "serve", "compare", "sweep", "capacity")
FIELDS = {f.name: f for f in dataclasses.fields(EngineArgs)}
HINTS = typing.get_type_hints(EngineArgs)
CHOICE_FIELDS = [n for n, f in FIELDS.items() if f.metadata.get("choices")]
FLOAT_FIELDS = [n for n in FIELDS if HINTS[n] in (float, float | None)]


def test_attention_backend_choices_match_the_kernels():
    from cbbench.kernels import BACKEND_NAMES

    assert ATTENTION_BACKENDS == BACKEND_NAMES


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_every_engine_command_takes_every_engine_option(command):
    group = typer_command(command)
    flags = {opt for p in group.params for opt in p.opts}
    for name, f in FIELDS.items():
        if f.metadata.get("cli", True):
            assert field_flag(f) in flags, (command, name)


def typer_command(name: str):
    import typer.main

    return typer.main.get_command(app).commands[name]


def test_defaults_are_valid():
    assert EngineArgs().validate() == EngineArgs()


@pytest.mark.parametrize("name", CHOICE_FIELDS)
def test_a_bad_choice_is_rejected_by_validate(name):
    with pytest.raises(EngineArgsError, match=field_flag(FIELDS[name])):
        EngineArgs(**{name: "bogus"}).validate()


@pytest.mark.parametrize("name", CHOICE_FIELDS)
def test_a_bad_choice_exits_2_with_one_line_before_anything_runs(name, tmp_path):
    # --engine sim included: a torch-only option is checked on the simulator too.
    args = ["run", "--engine", "sim", "--num-requests", "3", "--output", str(tmp_path / "r.json")]
    r = runner.invoke(app, [*args, field_flag(FIELDS[name]), "bogus"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(f"cbbench: error: {field_flag(FIELDS[name])} must be")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_are_rejected(name, value):
    with pytest.raises(EngineArgsError, match="finite"):
        EngineArgs(**{name: value}).validate()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(max_num_seqs=0), "--max-num-seqs must be >= 1, got 0"),
        (dict(top_p=0.0), "--top-p must be in (0, 1], got 0.0"),
        (dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization must be in (0, 1], got 1.5"),
        (dict(swap_space=-1.0), "--swap-space must be >= 0, got -1.0"),
        (dict(seed=-1), "--seed must be in [0, 9223372036854775807], got -1"),
    ],
)
def test_range_messages_name_the_option_and_the_range(changes, message):
    with pytest.raises(EngineArgsError) as e:
        EngineArgs(**changes).validate()
    assert str(e.value) == message


def test_build_rejects_invalid_args_before_building():
    from cbbench.engine.build import build_engine

    with pytest.raises(EngineArgsError, match="--kv-allocation"):
        build_engine(EngineArgs(engine="sim", kv_allocation="bogus"))
