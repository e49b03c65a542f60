"""The result files have one typed, versioned schema (cbbench/schema/): `cbbench schema` prints
it, the files the commands write validate against it and round-trip, and every reader refuses a
file with a wrong-typed field in one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.schema import MODELS, to_dict

DATA = Path(__file__).resolve().parent.parent / "data" / "results"

SIM = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]
PROBE = ["--num-requests", "8", "--min-duration", "1"]


def _invoke(args):
    return CliRunner().invoke(app, args)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A real run, sweep, capacity and forward file, written by the commands themselves."""
    d = tmp_path_factory.mktemp("schema")
    run = d / "run.json"
    r = _invoke(["run", *SIM, "--num-requests", "12", "--save-detailed", "--slo", "ttft=500",
                 "--output", str(run)])
    assert r.exit_code == 0, r.output
    r = _invoke(["sweep", *SIM, *PROBE, "--rates", "4,inf", "--slo", "ttft_p99=5000",
                 "--out-dir", str(d / "sweep")])
    assert r.exit_code == 0, r.output
    r = _invoke(["capacity", *SIM, *PROBE, "--slo", "ttft_p99=5000", "--start-rate", "4",
                 "--out", str(d / "capacity.json")])
    assert r.exit_code in (0, 1), r.output  # 1: no rate met the SLO; the file is written
    r = _invoke(["forward", "--device", "cpu", "--model", "tiny", "--batch-sizes", "1",
                 "--context", "8", "--prefill-tokens", "16", "--steps", "1", "--warmup", "0",
                 "--output", str(d / "forward.json")])
    assert r.exit_code == 0, r.output
    return {"run": run, "sweep": d / "sweep" / "sweep.json", "capacity": d / "capacity.json",
            "forward": d / "forward.json"}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_schema_command_prints_a_json_schema_the_written_file_meets(kind, files):
    r = _invoke(["schema", kind])
    assert r.exit_code == 0, r.output
    schema = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    data = json.loads(files[kind].read_text())
    jsonschema.validate(data, schema)  # the printed schema, not only the pydantic model
    # The model takes the file, and gives back exactly the file.
    assert to_dict(MODELS[kind].model_validate(data)) == data


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_printed_schema_names_its_dialect_and_the_suites_files_meet_it(kind):
    """Without "$schema" a validator checks against a draft of its own choosing; the schema is
    pydantic's draft 2020-12 ($defs), so it says so, and the stored result files meet it."""
    schema = json.loads(_invoke(["schema", kind]).stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validator = jsonschema.validators.validator_for(schema, default=None)
    assert validator is jsonschema.Draft202012Validator
    validator(schema).validate(json.loads((DATA / f"{kind}.json").read_text()))


def test_the_schema_types_what_it_names():
    """A wrong-typed field fails the printed schema too (not only pydantic's strict mode)."""
    schema = MODELS["run"].model_json_schema()
    bad = {"schema_version": 1, "config": {}, "summary": {"completed": "many", "failed": 0}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_an_unknown_schema_kind_is_refused():
    r = _invoke(["schema", "runs"])
    assert r.exit_code == 2 and r.stderr.startswith("cbbench: error: unknown schema")


def _tampered(files, tmp_path, kind="run", change=None):
    data = json.loads(files[kind].read_text())
    (change or (lambda d: d["summary"].__setitem__("completed", "many")))(data)
    bad = tmp_path / f"bad-{kind}.json"
    bad.write_text(json.dumps(data))
    return bad


def _readers(files, bad, tmp_path):
    good = str(files["run"])
    return {
        "compare": ["compare", good, str(bad)],
        "gate": ["gate", str(bad), "--baseline", good],
        "report": ["report", good, str(bad), "--out", str(tmp_path / "report")],
        "calibrate": ["calibrate", str(bad), "--out", str(tmp_path / "profile.json")],
        "replay": ["run", *SIM, "--replay", str(bad), "--output", str(tmp_path / "again.json")],
    }


@pytest.mark.parametrize("reader", ["compare", "gate", "report", "calibrate", "replay"])
def test_every_reader_refuses_a_wrong_typed_field_in_one_line(files, tmp_path, reader):
    bad = _tampered(files, tmp_path)
    r = _invoke(_readers(files, bad, tmp_path)[reader])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.stderr
    assert lines[0].startswith("cbbench: error: ") and "summary.completed" in lines[0], lines
    # Refused before anything was written (report may have made its folder, left empty).
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != bad]
    assert not written, written


@pytest.mark.parametrize("reader", ["compare", "gate", "report", "calibrate", "replay"])
def test_every_reader_refuses_a_wrong_typed_iteration_field(files, tmp_path, reader):
    """The schema types an iteration's batch-shape fields (what calibrate fits), so every
    reader refuses text there the same way, before calibrate's own range checks."""
    bad = _tampered(files, tmp_path, change=lambda d: d["iterations"][0].__setitem__(
        "num_logits", "3"))
    r = _invoke(_readers(files, bad, tmp_path)[reader])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "iterations.0.num_logits" in lines[0], r.stderr


def test_report_refuses_a_wrong_typed_sweep_point(files, tmp_path):
    bad = _tampered(files, tmp_path, "sweep",
                    lambda d: d["points"][0].__setitem__("ttft_p99_ms", "slow"))
    r = _invoke(["report", str(bad), "--out", str(tmp_path / "report")])
    assert r.exit_code == 2, r.output
    assert "points.0.ttft_p99_ms" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_capacity_file_with_a_wrong_typed_field_is_refused(files, tmp_path):
    from cbbench.errors import UsageError
    from cbbench.schema import read_capacity

    read_capacity(files["capacity"])  # the real one reads
    bad = _tampered(files, tmp_path, "capacity", lambda d: d.__setitem__("precision", "5%"))
    with pytest.raises(UsageError, match="precision"):
        read_capacity(bad)


def test_schema_to_a_full_device_is_one_line():
    """Issue 37, rule 7: `cbbench schema run > /dev/full` ended in an OSError traceback."""
    import os
    import subprocess

    from helpers import CBBENCH

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    with open("/dev/full", "w") as full:
        out = subprocess.run([*CBBENCH, "schema", "run"], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("cbbench: error: cannot write the schema") and \
        len(out.stderr.strip().splitlines()) == 1, out.stderr
