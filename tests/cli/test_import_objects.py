"""An importer reads another tool's objects through models (cbbench/importers/fields.py): a
value where the tool writes an object is refused in one line that names the field, for every
object the importers read. GuideLLM's scenario config as a list was refused with pydantic's
two-line ValidationError text before (issue 36: the one-line rule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

runner = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "data"
GUIDELLM = DATA / "guidellm" / "benchmarks.json"
INFERENCE_PERF = DATA / "inference-perf" / "per_request_lifecycle_metrics.json"
AIPERF_LINE = {
    "metadata": {"request_start_ns": 10**18, "credit_issued_ns": 10**18, "x_request_id": "r"},
    "metrics": {"time_to_first_token": {"value": 10.0, "unit": "ms"},
                "output_sequence_length": {"value": 1, "unit": "tokens"}},
    "error": None,
}


def _guidellm(path: str, value) -> str:
    data = json.loads(GUIDELLM.read_text())
    if path == "config":
        data["config"] = value
    elif path == "benchmark.config":
        data["benchmarks"][0]["config"] = value
    else:
        data["benchmarks"][0]["requests"]["successful"][0][path] = value
    return json.dumps(data)


def _inference_perf(path: str, value) -> str:
    rows = json.loads(INFERENCE_PERF.read_text())
    obj = rows[0]["info"]
    *head, last = path.split(".")
    for k in head:
        obj = obj[k]
    obj[last] = value
    return json.dumps(rows)


@pytest.mark.parametrize(("tool", "text", "says"), [
    ("guidellm", _guidellm("config", [1]), "config holds [1], not an object"),
    ("guidellm", _guidellm("benchmark.config", "x"), "benchmark 0: config holds 'x'"),
    ("guidellm", _guidellm("info", [1, 2]), "request 0: info holds [1, 2], not an object"),
    ("guidellm", _guidellm("output_metrics", 7), "output_metrics holds 7, not an object"),
    ("inference-perf", _inference_perf("response_metrics", [1]),
     "entry 0: info.response_metrics holds [1], not an object"),
    ("inference-perf", _inference_perf("response_metrics.server_usage", "x"),
     "info.response_metrics.server_usage holds 'x', not an object"),
    ("inference-perf", _inference_perf("request_metrics", 1.5),
     "info.request_metrics holds 1.5, not an object"),
    ("aiperf", json.dumps({**AIPERF_LINE, "metrics": [1]}), ":1: metrics holds [1], not an object"),
])
def test_a_value_where_an_object_belongs_is_one_line_naming_it(tmp_path, tool, text, says):
    src = tmp_path / "in.json"
    src.write_text(text + "\n")
    out = tmp_path / "o.json"
    extra = ("--benchmark", "0") if tool == "guidellm" else ()
    res = runner.invoke(app, ["import", str(src), "--from", tool, "--out", str(out), *extra])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith("cbbench: error:") and "\n" not in line, line
    assert says in line and f"({tool} writes an object there)" in line, line
    assert not out.exists()


def test_the_aiperf_line_of_these_cases_imports(tmp_path):
    """The cases' base line is a valid AIPerf record: each refusal above is its one change."""
    src = tmp_path / "in.json"
    src.write_text(json.dumps(AIPERF_LINE) + "\n")
    res = runner.invoke(app, ["import", str(src), "--from", "aiperf", "--out",
                              str(tmp_path / "o.json")])
    assert res.exit_code == 0, res.output
