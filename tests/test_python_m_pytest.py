"""`python -m pytest` from the repository root, the way many newcomers run a suite: it puts the root
first on sys.path, where the top-level kernels/ folder (installed as cbbench.kernels) stood in for
Hugging Face's `kernels` package, which transformers imports, and every Hugging Face comparison test
failed ("cannot import name 'CUDAProperties' from 'kernels'"). tests/conftest.py takes the root off
sys.path."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = "CBBENCH_TEST_PYTHON_M_CHILD"  # set for the child run only


def test_python_m_pytest_from_the_root_does_not_shadow_kernels():
    child = f"{Path(__file__).relative_to(ROOT)}::test_kernels_is_not_the_repository_folder"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", child],
        cwd=ROOT,
        env={**os.environ, CHILD: "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


@pytest.mark.skipif(not os.environ.get(CHILD), reason="the child of the test above")
def test_kernels_is_not_the_repository_folder():
    spec = importlib.util.find_spec("kernels")  # Hugging Face's, or none at all
    # (a virtual environment may live inside the checkout, as .ci/run's does: only the
    # repository's own kernels/ folder is the wrong one)
    ours = (ROOT / "kernels").resolve()
    assert spec is None or ours not in Path(spec.origin or "").resolve().parents
