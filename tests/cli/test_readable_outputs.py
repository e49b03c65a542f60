"""What gate, compare and report write reads in its standard reader whatever the result files
are named: a Linux file name is any bytes but NUL and '/', so it may hold a control character
(XML 1.0 forbids them) or bytes that are not UTF-8 (Python's str of the name holds them as lone
surrogates, which no UTF-8 file can)."""

from __future__ import annotations

import os
import shutil
import xml.etree.ElementTree as ET
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


@pytest.mark.parametrize("name", [ESC_NAME])
def test_gate_junit_and_markdown_read_whatever_the_files_are_named(tmp_path, name):
    new = _copy(tmp_path, name)
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    r = cli_in_process(["gate", new, "--baseline", RESULT, "--junit", junit, "--markdown", md])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    root = ET.parse(junit).getroot()  # well-formed XML: a JUnit reader takes it
    assert root.find("testsuite") is not None and root.find("testsuite/testcase") is not None
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["new"].startswith(str(tmp_path)) and props["new"].endswith("copy.json")
    assert "copy.json" in md.read_text(encoding="utf-8")
