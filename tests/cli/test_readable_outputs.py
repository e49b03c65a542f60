"""What gate, compare and report write reads in its standard reader whatever the result files
are named: a Linux file name is any bytes but NUL and '/', so it may hold a control character
(XML 1.0 forbids them) or bytes that are not UTF-8 (Python's str of the name holds them as lone
surrogates, which no UTF-8 file can)."""

from __future__ import annotations

import csv
import os
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import cli_in_process

RESULT = Path(__file__).parents[1] / "data" / "results" / "run.json"
ESC_NAME = "run\x1bcopy.json"  # a control character: legal in a file name, not in XML
NOT_UTF8_NAME = os.fsdecode(b"run\xffcopy.json")  # Latin-1's y-umlaut: not UTF-8


def _copy(tmp_path: Path, name: str) -> Path:
    try:
        return Path(shutil.copy(RESULT, tmp_path / name))
    except (OSError, UnicodeEncodeError) as e:  # a file system that refuses the name
        pytest.skip(f"cannot make the file {name!r}: {e}")


@pytest.mark.parametrize("name", [ESC_NAME, NOT_UTF8_NAME])
def test_gate_junit_and_markdown_read_whatever_the_files_are_named(tmp_path, name):
    new = _copy(tmp_path, name)
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    # --markdown to GitHub's step summary: appended to, not replaced (its own write)
    r = cli_in_process(["gate", new, "--baseline", RESULT, "--junit", junit, "--markdown", md],
                       env={"GITHUB_STEP_SUMMARY": str(md)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    root = ET.parse(junit).getroot()  # well-formed XML: a JUnit reader takes it
    assert root.find("testsuite") is not None and root.find("testsuite/testcase") is not None
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["new"].startswith(str(tmp_path)) and props["new"].endswith("copy.json")
    assert "copy.json" in md.read_text(encoding="utf-8")


def test_compare_csv_reads_whatever_the_files_are_named(tmp_path):
    new = _copy(tmp_path, NOT_UTF8_NAME)
    out = tmp_path / "cmp.csv"
    r = cli_in_process(["compare", RESULT, new, "--csv", out])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    with out.open(encoding="utf-8", newline="") as f:
        header = next(csv.reader(f))
    assert header[:3] == ["metric", "path", "run"] and header[3].endswith("copy")


def test_report_reads_whatever_the_files_are_named(tmp_path):
    new = _copy(tmp_path, NOT_UTF8_NAME)
    r = cli_in_process(["report", RESULT, new, "--out", tmp_path / "report"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    for page in ("report.html", "report-static.html"):
        text = (tmp_path / "report" / page).read_text(encoding="utf-8")
        parser = HTMLParser()
        parser.feed(text)
        parser.close()
        assert "copy.json" in text
