"""Shared test set-up: hypothesis profiles, the CUDA skip, and shared fixtures (helpers in
helpers.py).

Hypothesis: the "ci" profile (default) runs each property with the example count its module
gives (see README, "Tests"); HYPOTHESIS_PROFILE=thorough (or --hypothesis-profile=thorough) runs
THOROUGH_EXAMPLES of every property and state machine that takes its count from
helpers.examples(), with no deadline.

Triton kernels run on CPU tensors only under its interpreter, and Triton reads TRITON_INTERPRET
when a kernel is defined, so it must be set before any kernel module is imported. On a machine
with a GPU the compiled path is tested instead.
"""

import os
import sys

# One OpenBLAS thread for numpy/scipy, set before anything imports numpy (helpers, hypothesis
# and torch below do), and inherited by the subprocesses the tests start. The calibration fit
# limits itself (engine/sim/roofline_select.fit_rates: hundreds of small SVDs, whose OpenBLAS
# threads spin-wait on a shared machine); this holds every other numpy/scipy call in the suite
# to the same rule, the suite's tests sharing 2 cores. torch keeps its own thread pool (the
# engine sets it, engine/build_torch.py). setdefault: a run that asks for more threads gets them.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# `python -m pytest` (unlike the README's `pytest`) puts the current folder first on sys.path. From
# the repository root that made our top-level kernels/ folder (installed as cbbench.kernels)
# importable as `kernels`, in front of Hugging Face's `kernels` package, which transformers imports:
# every Hugging Face comparison test failed with "cannot import name 'CUDAProperties' from
# 'kernels'". The package is installed (editable or not), so the root on sys.path adds nothing else.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]

# The few hundred `cbbench` and `python` processes the tests start share one bytecode cache in a
# temporary folder. Where PYTHONDONTWRITEBYTECODE is set (some sandboxes set it), each of them
# would compile cbbench's modules from source again: 0.03-0.17 s of CPU a start
# (results/suite_time.md, 4e). A prefix outside the tree keeps the checkout free of .pyc files, as
# the setting meant; this process itself keeps the setting. A PYTHONPYCACHEPREFIX already set wins.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="cbbench-tests-pycache-")
    atexit.register(shutil.rmtree, os.environ["PYTHONPYCACHEPREFIX"], ignore_errors=True)

import pytest  # noqa: E402
from helpers import SERVE_MODEL, THOROUGH_EXAMPLES, serve_process  # noqa: E402

try:
    from hypothesis import settings
except ImportError:
    # The GPU image has torch and Triton but maybe not hypothesis, and conftest loads for every
    # test file: the CUDA test files gpu_check.sh runs do not need it.
    settings = None
if settings is not None:
    settings.register_profile("ci", deadline=None)
    settings.register_profile("thorough", deadline=None, max_examples=THOROUGH_EXAMPLES)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # the sim-only tests do not need torch
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _build_cbbench_command_once() -> None:
    """``CliRunner().invoke(app, ...)`` on cbbench's app builds its click command from the Typer
    app again each call (~55 ms of CPU, often more than the case it runs; a few hundred calls in
    the suite). Build it once per set of registered commands and reuse it, as helpers.invoke_app
    does: click commands are made to be invoked again, each invocation with its own context.
    Any other Typer app is built as before."""
    try:
        import typer.testing
    except ImportError:  # the GPU image's tests may run without the CLI's dependencies
        return
    build = getattr(typer.testing, "_get_command", None)
    if build is None:  # a private name of typer's: a release without it builds as before
        return
    built: dict[tuple, object] = {}

    def get_command(typer_instance):
        cli = sys.modules.get("cbbench.cli.app")
        if cli is None or typer_instance is not getattr(cli, "_app", None):
            return build(typer_instance)
        # The registration records, the sub-apps' (workloads) included: commands register on
        # first use (cli/app.py). The app keeps the records alive, so their ids stay theirs.
        key = (tuple(map(id, typer_instance.registered_commands)),
               tuple((id(g), *map(id, g.typer_instance.registered_commands))
                     for g in typer_instance.registered_groups))
        if key not in built:
            built[key] = build(typer_instance)
        return built[key]

    typer.testing._get_command = get_command


_build_cbbench_command_once()


# Benchmark and GPU scripts sit apart from the collected tests (run by hand or by gpu/gpu_check.sh).
collect_ignore = ["bench", "gpu"]


# The costliest modules on a 2-core CPU run (`pytest -q -n 2 --dist worksteal --durations=0`,
# 2026-12-07: 45-110 s each), run first: worksteal hands each worker a contiguous half of the
# collection and lets the one that runs dry take from the end of the other's, so the suite ends
# on short tests instead of one worker finishing a long module while the other waits. Order
# only: every test still runs, and a module's tests stay together.
FIRST = ("engine/test_gpu_check.py", "kernels/test_kernels.py", "engine/test_sim_scale.py",
         "kernels/test_kernels_split_k.py", "targets/test_workers_ray.py",
         "targets/test_audit.py", "analysis/test_calibrate.py", "cli/test_interrupts.py",
         "engine/test_engine_policies_state.py", "cli/test_sweep.py")  # fmt: skip


def _first_rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next((k for k, name in enumerate(FIRST) if path.endswith(name)), len(FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_first_rank)  # stable: the rest keep their order
    if _HAS_CUDA:
        return
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip_cuda)


@pytest.fixture(scope="module")
def fake_server():
    """The fake OpenAI-compatible streaming server (tests/fake_openai.py), one per test module;
    a request steers it with words in its prompt (`fault:NAME`, `delay:S`)."""
    from fake_openai import FakeOpenAI  # imported here: the GPU image's tests do not need it

    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fresh_fake_server(fake_server):
    """The module's fake server with its request log and in-flight peak cleared."""
    fake_server.reset()
    return fake_server


@pytest.fixture
def sim_serve_process():
    """`cbbench serve --engine sim` (Llama-3.2-1B on a simulated H200) as its own process, as a
    user would start it; yields a helpers.ServeProcess (``.url``, ``.proc``, ``.text``)."""
    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200") as run:
        yield run


@pytest.fixture
def notices():
    """The one-line notices the code under test logged (the `cbbench` logger's records, which
    the CLI prints as `cbbench: ...`), as a list of messages."""
    import logging

    got: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    logger, handler = logging.getLogger("cbbench"), Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(level)
