"""Issue 36: `cbbench calibrate`'s tables read the profile's model (schema/profile.py) by
attribute. tests/data/calibration_profile.json is a fit of a re-timed simulated run (one rate
made confounded, one not identified, one residual class empty, one warning);
calibration_table.txt is the table the dict-reading code printed for it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import cbbench.analysis.calibration as calibration
import cbbench.analysis.calibration_inputs as calibration_inputs
from cbbench.cli.app import app
from cbbench.cli.calibrate import render
from cbbench.schema import dumps
from cbbench.schema.profile import CalibrationProfile

DATA = Path(__file__).resolve().parents[1] / "data"
PROFILE = DATA / "calibration_profile.json"
TABLE = (DATA / "calibration_table.txt").read_text()


def test_the_table_from_the_model_is_the_table_the_dict_gave():
    model = CalibrationProfile.model_validate(json.loads(PROFILE.read_text()))
    assert render(model) == TABLE


def test_the_command_prints_the_table_and_warnings_and_writes_the_profile(monkeypatch,
                                                                           tmp_path):
    profile = json.loads(PROFILE.read_text())
    monkeypatch.setattr(calibration_inputs, "read_input", lambda path: ("run", {}))
    monkeypatch.setattr(calibration, "calibrate", lambda runs, benches: profile)
    given = tmp_path / "real.json"
    given.write_text("{}")
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["calibrate", str(given), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout == (f"{TABLE}\nwarning: {profile['warnings'][0]}\n\nprofile: {out}\n")
    assert out.read_text() == dumps(profile) + "\n"
