"""Issue 36: `cbbench forward` builds its file's model once (schema/forward.py) and its table
reads the model by attribute. tests/data/results/forward.json is a tiny CPU run (with one
failed shape added); forward_table.txt is the table the dict-reading code printed for it. The
file written from the model is the bytes the dict gave; a measurement the schema refuses is
still written, and the command says why in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cbbench.bench.forward as bench_forward
from cbbench.cli.app import app
from cbbench.cli.forward import forward_table
from cbbench.schema import ForwardResult, dumps

DATA = Path(__file__).resolve().parents[1] / "data" / "results"
ARGS = ["forward", "--model", "tiny", "--device", "cpu", "--batch-sizes", "4", "--context", "40",
        "--prefill-tokens", "64", "--steps", "2", "--warmup", "1"]


def _measured() -> dict:
    data = json.loads((DATA / "forward.json").read_text())
    data.pop("command")  # the command sets it
    return data


def test_the_table_from_the_model_is_the_table_the_dict_gave():
    model = ForwardResult.model_validate(json.loads((DATA / "forward.json").read_text()))
    assert forward_table(model) == (DATA / "forward_table.txt").read_text()


@pytest.fixture
def measured(monkeypatch):
    data = _measured()
    # The file's command is this process's argv (redacted as a run's is): the CLI's, not
    # pytest's or an xdist worker's.
    monkeypatch.setattr(sys, "argv", ["cbbench", *ARGS, "--output", "forward.json"])
    monkeypatch.setattr(bench_forward, "run_forward", lambda spec, log: json.loads(json.dumps(data)))
    return data


def test_the_file_is_the_dicts_bytes_and_a_failed_shape_exits_2(measured, tmp_path):
    out = tmp_path / "forward.json"
    r = CliRunner().invoke(app, [*ARGS, "--output", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().endswith("cbbench: error: 1 shape(s) failed (their errors are in "
                                     "the file): first RuntimeError('no graphs on a CPU')")
    assert (DATA / "forward_table.txt").read_text() in r.stdout
    written = json.loads(out.read_text())
    assert written["command"] == " ".join(["cbbench", *ARGS, "--output", "forward.json"])
    assert out.read_text() == dumps({**measured, "command": written["command"]}) + "\n"


def test_a_measurement_the_schema_refuses_is_written_before_the_error(measured, tmp_path):
    measured["rows"][0]["tokens"] = "many"
    out = tmp_path / "forward.json"
    r = CliRunner().invoke(app, [*ARGS, "--output", str(out)])
    assert r.exit_code == 2, r.output
    assert "not a valid ForwardResult: rows.0.tokens" in r.stderr
    assert "Traceback" not in r.output
    assert json.loads(out.read_text())["rows"][0]["tokens"] == "many"  # kept as measured
