"""The endpoint path's start (issue 41: the first request leaves within 1.5 s of the command):
what a streamed run never uses is not imported before it sends. Checked in a fresh
interpreter, so no other test's imports count."""

from __future__ import annotations

import subprocess
import sys

# Imported only by the runs that use them: the pooled APIs (embeddings, rerank), and aiohttp
# (the small GETs and POSTs, imported when a run starts).
NOT_AT_IMPORT = ("cbbench.targets.apis.pooling_request", "aiohttp")


def _imported_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    return set(out.split())


def test_the_load_generator_imports_no_pooled_api_or_aiohttp():
    mods = _imported_after("import cbbench.distributed.run")
    assert "cbbench.targets.http" in mods  # the module under test was imported
    assert not mods & set(NOT_AT_IMPORT), mods & set(NOT_AT_IMPORT)


def test_cbbench_run_registers_run_alone():
    mods = _imported_after(
        "from cbbench.cli.app import _register\n_register({'run'})")
    assert "cbbench.cli.run" in mods
    assert not {"cbbench.cli.serve", "cbbench.cli.audit", "cbbench.cli.sweep"} & mods
