"""What a `cbbench` process imports before it does anything (issue 36 item 5, issue 41 item 2):
every test that starts the console script, and every user, pays for it on each start.

`cbbench --help` registers every command (cli/app.py), so each command module imports only
what its options need, and the rest where the command runs: the help costs no numpy, no
pydantic and no result models. A simulated run needs numpy and the result models, but not torch,
the HTTP clients or the server. Checked in a fresh interpreter, so no other test's imports count."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cbbench.cli.app import COMMANDS

# Never imported by `cbbench --help` (each a tenth of a second or more of a start).
NOT_FOR_HELP = ("numpy", "pydantic", "cbbench.schema", "cbbench.analysis.result", "torch",
                "aiohttp", "scipy")
# Never imported by a simulated run: the torch engine, Triton, the tokenizers, the HTTP clients
# and the server, Ray, the plots.
NOT_FOR_SIM = ("torch", "triton", "transformers", "tokenizers", "aiohttp", "httpx", "openai",
               "anthropic", "uvloop", "cbbench.server.app", "ray", "scipy", "matplotlib",
               "plotly", "PIL", "pyarrow",
               # The other result files' models: a run writes only the run result.
               "cbbench.schema.sweep", "cbbench.schema.capacity", "cbbench.schema.forward")
# Never imported by a run off a terminal: Rich draws the live view and renders the help, and a
# run with its output piped does neither (the help texts are tidied for Rich only when the
# help is shown: cli/help.py).
NOT_OFF_A_TERMINAL = ("rich",)

# Runs the CLI in this interpreter, then prints what it imported (JSON) on a line of its own.
RUN_CLI = """
import json, sys
sys.argv = ["cbbench", *sys.argv[1:]]
from cbbench.cli.app import main
try:
    main()
except SystemExit as e:
    code = e.code
print("\\n" + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _start(*argv: str, cwd=None) -> tuple[int, set[str], str]:
    """(exit code, modules imported, stdout) of `cbbench ARGV` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", RUN_CLI, *argv], capture_output=True, text=True,
                         timeout=300, cwd=cwd, env={**os.environ, "COLUMNS": "200"}).stdout
    printed, _, last = out.rstrip("\n").rpartition("\n")
    got = json.loads(last)
    return got["code"], set(got["modules"]), printed


def test_help_imports_no_numpy_pydantic_or_result_models():
    code, mods, printed = _start("--help")
    assert code == 0
    # Every command was registered, so every command module's imports are in the set.
    assert {f"cbbench.cli.{module}" for _, module in COMMANDS} <= mods
    assert all(name in printed for name, _ in COMMANDS), printed
    assert not mods & set(NOT_FOR_HELP), sorted(mods & set(NOT_FOR_HELP))


def test_a_simulated_run_imports_no_torch_http_or_server(tmp_path):
    out = tmp_path / "r.json"
    code, mods, _ = _start("run", "--engine", "sim", "--workload", "random", "--input-len", "16",
                           "--output-len", "4", "--num-requests", "3", "--output", str(out),
                           cwd=tmp_path)
    assert code == 0 and out.exists()
    assert {"numpy", "cbbench.schema", "cbbench.engine.sim.sim_executor"} <= mods  # it ran
    assert not mods & set(NOT_FOR_SIM), sorted(mods & set(NOT_FOR_SIM))
    assert not mods & set(NOT_OFF_A_TERMINAL), sorted(mods & set(NOT_OFF_A_TERMINAL))


def test_version_registers_no_command():
    code, mods, printed = _start("--version")
    assert code == 0 and printed.startswith("cbbench ")
    assert not {f"cbbench.cli.{module}" for _, module in COMMANDS} & mods


# What a run refused at its options must not have imported: the summary code and numpy, and
# the result models (the option checks once imported all three, for --slice and --percentiles).
NOT_FOR_REFUSED_OPTIONS = ("numpy", "cbbench.schema.run", "cbbench.analysis.summary.slices",
                           "cbbench.bench.runner")


def test_a_run_refused_at_its_options_imports_no_numpy_or_result_models():
    code, mods, _ = _start("run", "--engine", "sim", "--max-num-seqs", "0")
    assert code == 2
    assert not mods & set(NOT_FOR_REFUSED_OPTIONS), sorted(mods & set(NOT_FOR_REFUSED_OPTIONS))
