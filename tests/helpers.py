"""Helpers shared by test modules (import with ``from helpers import ...``; pytest puts tests/
on the path): a tiny random-weight Hugging Face model and its greedy reference outputs, and
`cbbench serve` with the simulated engine, in-process or as its own process.

torch and transformers are imported inside the functions that need them, so the sim-only tests
that import this module do not pay for them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

# ---- the Llama-3.1 tokenizer -------------------------------------------------------------------
# Licensed, so never in the repo: shared/ sits in the repo root on the device machine, beside
# the checkout (or beside its parent folder) elsewhere.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA3_DIR_CANDIDATES = [
    os.path.join(base, "shared", "tokenizers", "llama-3.1")
    for base in (_REPO, os.path.dirname(_REPO), os.path.dirname(os.path.dirname(_REPO)))
]


def llama3_tokenizer_dir() -> str:
    """The Llama-3.1 tokenizer's folder (tokenizer.json and tokenizer_config.json); skips the
    calling test where this machine has none."""
    import pytest

    for d in LLAMA3_DIR_CANDIDATES:
        if os.path.isfile(os.path.join(d, "tokenizer.json")):
            return d
    pytest.skip("no Llama-3.1 tokenizer.json in shared/tokenizers/ on this machine")


# ---- hypothesis example counts -------------------------------------------------------------------
# tests/conftest.py registers two profiles: "ci" (the default), under which each property and
# state machine runs the count its module gives examples(), and "thorough", under which every one
# runs THOROUGH_EXAMPLES (HYPOTHESIS_PROFILE=thorough, or pytest --hypothesis-profile=thorough).
THOROUGH_EXAMPLES = 10_000


def examples(ci: int) -> int:
    """Examples for a property or state machine: ``ci`` under the default profile, or the
    thorough profile's count."""
    from hypothesis import settings

    return max(ci, THOROUGH_EXAMPLES) if settings().max_examples >= THOROUGH_EXAMPLES else ci


def wait_until(condition, timeout: float, what: str, poll_s: float = 0.02) -> None:
    """Wait for ``condition()`` to hold (a state the test cannot get an event for, such as a
    server's connection count), failing with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(poll_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- a tiny Hugging Face model ---------------------------------------------------------------
TINY_VOCAB = 512
TINY_SIZES = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=TINY_VOCAB,
    max_position_embeddings=256,
    initializer_range=0.1,  # larger than the default so every weight visibly matters
)
HF_CLASSES = {  # model_type -> (config class, model class) names in transformers
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def tiny_hf_model(kind: str = "llama", seed: int = 0, **overrides):
    """A random-weight ``kind`` model of TINY_SIZES (``overrides`` change the config), in eval
    mode. HF initializes biases to 0 and norms to 1; both are randomized so they matter."""
    import torch
    import transformers

    config_cls, model_cls = (getattr(transformers, name) for name in HF_CLASSES[kind])
    config = config_cls(**{**TINY_SIZES, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.1)
    return model


def hf_greedy(model, prompts: Sequence[list[int]], output_lens: Sequence[int]) -> list[list[int]]:
    """Each prompt alone through HF ``generate``, greedy, exactly its output length of new
    tokens: the reference the engine must match token for token."""
    import torch

    outs = []
    with torch.no_grad():
        for ids, n in zip(prompts, output_lens, strict=True):
            x = torch.tensor([ids])
            y = model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
            outs.append(y[0, len(ids) :].tolist())
            assert len(outs[-1]) == n
    return outs


# ---- `cbbench serve` in-process ----------------------------------------------------------------
SERVE_MODEL = "llama-3.2-1b"
SERVE_CONTEXT = 8192
SERVE_KV_BLOCKS = 256  # 4096 tokens: smaller than the context, so "too big for the pool" is testable
SERVE_BLOCK_SIZE = 16
SERVE_OVERHEAD_US = 2000  # keeps token gaps well above scheduling noise
START_TIMEOUT_S = 15.0
POLL_S = 0.02


def sim_options(**kw):
    """EngineArgs of a small simulated engine for `serve` tests (``kw`` overrides)."""
    from cbbench.engine.args import EngineArgs

    base = dict(
        engine="sim", model=SERVE_MODEL, gpu="h200", max_model_len=SERVE_CONTEXT,
        num_kv_blocks=SERVE_KV_BLOCKS, block_size=SERVE_BLOCK_SIZE,
        iteration_overhead_us=SERVE_OVERHEAD_US,
    )  # fmt: skip
    base.update(kw)
    return EngineArgs(**base)


# ---- a run's spec by its flags -----------------------------------------------------------------
def run_spec(**flags):
    """A RunSpec from flat names, as a test writes them: each field of the load and output
    option groups (workload=, seed=, think_time=, label=, ...), and RunSpec's own engine=,
    endpoint=, load_plan=. request_rate= and slo= may be the parsed values (a float, a dict of
    limits), as a probe sets them; num_requests defaults to 1000 (vLLM's)."""
    from dataclasses import fields

    from cbbench.bench.run_spec import DEFAULT_NUM_REQUESTS, RunSpec
    from cbbench.engine.args import EngineArgs
    from cbbench.options import LoadOptions, OutputOptions

    flags.setdefault("num_requests", DEFAULT_NUM_REQUESTS)
    rate = flags.get("request_rate")
    if isinstance(rate, (int, float)):
        flags["request_rate"] = "inf" if math.isinf(rate) else repr(float(rate))
    slo = flags.get("slo")
    if isinstance(slo, dict):
        flags["slo"] = ",".join(f"{k}={v!r}" for k, v in slo.items())
    load, output = (group(**{f.name: flags.pop(f.name) for f in fields(group) if f.name in flags})
                    for group in (LoadOptions, OutputOptions))
    return RunSpec(load, flags.pop("engine", EngineArgs()), output, **flags)


@dataclass
class Running:
    url: str
    app: object
    server: object  # uvicorn.Server
    thread: threading.Thread

    @property
    def engine(self):
        return self.app.state.engine

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(START_TIMEOUT_S)


def start_server(build, config=None, wait_ready: bool = True) -> Running:
    """The server app on uvicorn in a thread, on a free 127.0.0.1 port; ``build`` returns
    (engine, info) as build_serving_engine does."""
    import uvicorn

    from cbbench.server.app import ServeConfig, create_app

    app = create_app(build, config or ServeConfig())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    run = Running(f"http://127.0.0.1:{port}", app, server, thread)
    if wait_ready:
        assert run.engine.wait_ready(START_TIMEOUT_S), run.engine.error
    return run


# ---- `cbbench serve` as its own process ---------------------------------------------------------
# The installed command's entry point, run by this interpreter (no console script needed).
CBBENCH = [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
PROCESS_READY_TIMEOUT_S = 60.0  # start-up imports on a busy 2-core machine
PROCESS_STOP_TIMEOUT_S = 15.0
READY_LINE = re.compile(r"ready at (http://\S+)/v1")


@dataclass
class ServeProcess:
    proc: subprocess.Popen
    url: str = ""
    output: list[str] = field(default_factory=list)  # everything it printed so far
    output_done: threading.Event = field(default_factory=threading.Event)  # its stdout closed

    @property
    def text(self) -> str:
        return "".join(self.output)


@contextlib.contextmanager
def serve_process(*args: str, env: dict[str, str] | None = None) -> Iterator[ServeProcess]:
    """`cbbench serve --port 0 ARGS` as a user would start it; yields once it printed its URL,
    and stops it with SIGINT (then SIGKILL) on exit."""
    cmd = [*CBBENCH, "serve", "--port", "0", *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env
    )
    run = ServeProcess(proc)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            run.output.append(line)
            lines.put(line)
        run.output_done.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + PROCESS_READY_TIMEOUT_S
        while not run.url and time.monotonic() < deadline:
            try:
                m = READY_LINE.search(lines.get(timeout=0.5))
            except queue.Empty:
                assert proc.poll() is None, f"cbbench serve exited:\n{run.text}"
                continue
            run.url = m.group(1) if m else ""
        assert run.url, f"cbbench serve was not ready in {PROCESS_READY_TIMEOUT_S:.0f} s:\n{run.text}"
        yield run
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(PROCESS_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(PROCESS_STOP_TIMEOUT_S)


def serve_app():
    """The real app, for CliRunner: its command classes hold the one bad-input boundary
    (exit 2) that `cbbench serve` relies on."""
    from cbbench.cli.app import app

    return app


# ---- one run computed two ways (the array simulator and compact summary vs the objects) -------
POOLED = ("itl_ms", "event_gap_ms")
POOLED_REL = 1e-9


def assert_same(a, b, path: str = "summary") -> None:
    """``a`` (the compact path's) equals ``b`` (the object path's), recursively: exactly (type,
    value, key order) except the mean and std of the pooled per-token distributions, to
    POOLED_REL (a weighted sum adds in another order than numpy's sum of the expanded array)."""
    if isinstance(b, dict):
        assert isinstance(a, dict), path
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in b:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        parts = path.split(".")
        pooled = len(parts) >= 2 and parts[-2] in POOLED and parts[-1] in ("mean", "std")
        if pooled and isinstance(b, float):
            assert math.isclose(a, b, rel_tol=POOLED_REL), f"{path}: {a} != {b}"
        else:
            assert type(a) is type(b) and a == b, f"{path}: {a!r} != {b!r}"


# ---- `cbbench ARGV` in this process -------------------------------------------------------------
# Each `cbbench` process pays ~1 CPU-s of imports before it reads its first option; a test of
# what the command says and returns (not of a signal, a real exit or a real server) runs it
# here instead, as the console script would (cbbench/cli/app.py: main() is
# sys.exit(_invoke())). tests/cli/test_bad_input.py checks the two agree on real processes.
# Warnings a real process shows by default, printed there on stderr (one more line).
HIDDEN_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


@dataclass
class CliOutcome:
    """What a `cbbench` process would have shown: its exit status, stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str
    args: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _environ(changes: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cli_in_process(argv: Sequence[str], cwd=None, env: dict[str, str] | None = None) -> CliOutcome:
    """`cbbench ARGV` run by the console script's own entry (``_invoke``) in this process, in
    ``cwd`` with ``env`` set on top of the environment: the exit status main() would exit with,
    what it printed, and, as a real process would print them, an escaped exception's traceback
    (status 1) and the warnings shown by default. The main thread only (signal handlers)."""
    import io
    import traceback
    import warnings

    from cbbench.cli.app import _invoke

    out, err = io.StringIO(), io.StringIO()
    args = [str(a) for a in argv]
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    sys.argv = ["cbbench", *args]
    try:
        with _environ(env or {}), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err), warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("default")
            if cwd is not None:
                os.chdir(cwd)
            try:
                code = _invoke()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # what the real process would end with
                traceback.print_exc(file=err)
                code = 1
        for w in shown:
            if not issubclass(w.category, HIDDEN_WARNINGS):
                err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
    return CliOutcome(code, out.getvalue(), err.getvalue(), args)


@functools.cache
def app_command():
    """cbbench's whole command line as the click command Typer builds from it (~50 ms each
    time CliRunner.invoke builds it again, often more than the case it runs)."""
    import typer.main

    from cbbench.cli.app import app

    return typer.main.get_command(app)


def invoke_app(args: Sequence[str], **kwargs):
    """typer's ``CliRunner().invoke(app, args, **kwargs)`` on cbbench's whole app (its click
    command is built once per set of registered commands: tests/conftest.py)."""
    import typer.testing

    from cbbench.cli.app import app

    return typer.testing.CliRunner().invoke(app, list(args), **kwargs)


def one_line(res, *texts: str) -> str:
    """A CliRunner result that is bad input: exit 2 and one stderr line `cbbench: error: ...`
    holding ``texts``; the line."""
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), res.stderr
    for t in texts:
        assert t in lines[0], (t, lines[0])
    return lines[0]


@contextlib.contextmanager
def logged_server(log, build, cfg):
    """start_server with a request log: yields (run, read_log), read_log() the log's lines by
    id, stopping the server first (the log is complete then)."""
    import json as _json

    run = start_server(build, cfg)
    stopped = False

    def read_log() -> dict:
        nonlocal stopped
        if not stopped:
            run.stop()
            stopped = True
        return {x["id"]: x for x in map(_json.loads, log.read_text().splitlines())}

    try:
        yield run, read_log
    finally:
        if not stopped:
            run.stop()
