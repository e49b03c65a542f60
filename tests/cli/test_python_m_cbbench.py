"""`python -m cbbench` runs the CLI of the interpreter that runs it, with nothing on PATH: the
results/ scripts use it (a bare "cbbench" died with a traceback where the environment's bin/ was
not on PATH)."""

from __future__ import annotations

import subprocess
import sys


def test_python_m_cbbench_runs_the_cli_without_path(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cbbench", "workloads", "list"], capture_output=True,
                       text=True, cwd=tmp_path, env={"PATH": "", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "sharegpt" in r.stdout
