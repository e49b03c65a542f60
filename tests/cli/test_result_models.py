"""Issue 36: the readers return the schema's models, and a model's own dump is the file byte
for byte. The fixtures under tests/data/results/ were written by the code before the change
(a run with --save-detailed and --slice, a sweep.json, a capacity.json): every kind of file
the last round wrote still reads, and reads back to the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cbbench.schema import (
    CapacityFile,
    RunResult,
    SweepFile,
    file_text,
    read_capacity,
    read_run,
    read_sweep,
    to_dict,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "results"
KINDS = {
    "run.json": (read_run, RunResult),
    "sweep.json": (read_sweep, SweepFile),
    "capacity.json": (read_capacity, CapacityFile),
}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_an_older_file_reads_as_its_model_and_dumps_to_the_same_bytes(name):
    read, model = KINDS[name]
    path = DATA / name
    record = read(path)
    assert type(record) is model
    assert file_text(record) == path.read_text()  # keys, their order and values
    assert to_dict(record) == json.loads(path.read_text())


def test_a_run_reads_by_attribute():
    run = read_run(DATA / "run.json")
    raw = json.loads((DATA / "run.json").read_text())
    assert run.summary.completed == raw["summary"]["completed"] == 6
    assert run.config.seed == 3
    assert run.summary.ttft_ms is not None
    assert run.summary.ttft_ms.p99 == raw["summary"]["ttft_ms"]["p99"]  # a pNN: an extra field
    assert run.requests is not None and run.requests[0].token_times_s is not None
    assert isinstance(run.config.percentiles[0], int)  # 50 stays 50, not 50.0


def test_a_field_set_after_reading_is_written_in_place():
    run = read_run(DATA / "run.json")
    run.summary.completed = 5
    run.interrupted = True
    data = json.loads(file_text(run))
    assert data["summary"]["completed"] == 5 and data["interrupted"] is True
    assert list(data) == list(json.loads((DATA / "run.json").read_text()))


def test_an_auto_sweeps_file_reads(tmp_path):
    """`sweep --rates auto` writes "rates": "auto"; the schema took only a list, so
    `cbbench report` refused every auto sweep's sweep.json."""
    data = json.loads((DATA / "sweep.json").read_text())
    data["rates"] = "auto"
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(data))
    assert read_sweep(path).rates == "auto"
