"""A pytest plugin (`-p tests.gpu.no_hypothesis`) that runs the session as on an image without
hypothesis: `import hypothesis` raises ImportError. The CPU smoke of gpu_check.sh gives it to
the pytest step (GPU_CHECK_PYTEST_ARGS), so that step's collection is also the check that the
CUDA test files collect where hypothesis is not installed (tests/engine/test_gpu_check.py)."""

import sys

sys.modules["hypothesis"] = None  # type: ignore[assignment]
