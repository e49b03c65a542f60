"""Issue 36: `cbbench audit`'s printout reads the report by structural pattern matching, not
string keys. tests/data/audit_printout.txt is what the dict-indexing code printed for these
hand-made reports (every kind of metric row, a metric shown but not gated, a transit line or
none, a cause or none, a pass and a failure): the text stays the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import cbbench.analysis.server_side.audit as audit_lib
import cbbench.schema as schema
from cbbench.cli.app import app

EXPECTED = Path(__file__).resolve().parents[1] / "data" / "audit_printout.txt"
SEPARATOR = "\n=====\n"


def _errors(median, p99, worst, n, passed=True, **extra):
    return {"median": median, "p99": p99, "max": worst, "count": n, **extra, "passed": passed}


FAILED = {
    "joined": 9, "joined_by": "server_request_id", "without_id": 1, "not_in_log": 2,
    "not_comparable": 3, "basis": "shared_clock",
    "request_transit_ms": {"median": 0.1234, "p99": 0.5678, "max": 0.9, "count": 9},
    "tolerance_ms": 1.0, "tail_tolerance_ms": None,
    "metrics": {
        "ttft_ms": _errors(0.25, 1.5, 2.0, 9),
        "ttfot_ms": _errors(None, None, None, 0),
        "e2el_ms": _errors(-3.5, 4.0, 5.0, 9, passed=False),
        "ttft_p50_ms": {"client": 12.5, "server": 12.0, "error": 0.5, "gated": True,
                        "passed": True},
        "itl_p50_ms": {"client": None, "server": 4.0, "error": None, "gated": False,
                       "passed": True},
        "server_queue_ms": _errors(0.01, 0.02, 0.03, 9, gated=False),
        "output_tokens": {"requests": 9, "mismatched": 2, "max_abs_diff": 3, "passed": False},
        "tokens_per_event": {"requests": 9, "mismatched": 0, "server_mean": 1.0,
                             "passed": True},
    },
    "coverage": {"completed": 15, "joined": 9, "missing": 6, "passed": False},
    "cause": "e2el_ms off by up to 5.0 ms, and the client recorded no lag",
    "passed": False,
}
PASSED = {
    **FAILED, "without_id": 0, "not_in_log": 0, "not_comparable": 0,
    "request_transit_ms": {"median": None, "p99": None, "max": None, "count": 0},
    "metrics": {"ttft_ms": _errors(0.1, 0.2, 0.3, 4)}, "cause": None, "passed": True,
}
REPORTS = {"failed": FAILED, "passed": PASSED}


def _printout(monkeypatch, tmp_path, report) -> tuple[int, str]:
    # `cbbench audit` imports these when it runs (cli/audit.py keeps --help light): patched
    # where they live.
    monkeypatch.setattr(schema, "read_run", lambda path: {})
    monkeypatch.setattr(audit_lib, "read_server_log", lambda path: {})
    monkeypatch.setattr(audit_lib, "audit", lambda *a: report)
    given = tmp_path / "r.json"
    given.write_text("{}")
    r = CliRunner().invoke(app, ["audit", str(given), "--server-log", str(given),
                                 "--tolerance-ms", "1.5"])
    return r.exit_code, r.stdout


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_the_printout_is_the_one_the_dict_gave(monkeypatch, tmp_path, name):
    code, text = _printout(monkeypatch, tmp_path, REPORTS[name])
    assert code == (0 if REPORTS[name]["passed"] else 1)
    expected = dict(zip(REPORTS, EXPECTED.read_text().split(SEPARATOR), strict=True))
    assert text == expected[name]
