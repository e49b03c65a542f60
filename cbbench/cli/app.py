"""The `cbbench` command line (Typer)."""

from __future__ import annotations

import gc
import logging
import os
import sys
from types import ModuleType
from typing import Annotated

import typer

from cbbench import __version__
from cbbench.cli import closed_pipe, logs
from cbbench.cli.help import TidyGroup, tidy_commands

_app = typer.Typer(
    name="cbbench",
    help="Benchmark LLM serving: TTFT/TPOT/ITL distributions, throughput, and the engine's "
    "per-iteration story, against the bundled engine or any OpenAI-compatible endpoint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=TidyGroup,
)
workloads_app = typer.Typer(
    help="List and inspect workloads.", no_args_is_help=True, cls=TidyGroup
)
_app.add_typer(workloads_app, name="workloads")


INTERRUPTED_EXIT = 130
VERSION_FLAG = "--version"
logs.install()  # the library's notices print as `cbbench: ...` lines


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cbbench {__version__}")
        raise typer.Exit()


@_app.callback()
def _root(
    version: Annotated[
        bool, typer.Option(VERSION_FLAG, callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    pass


# Each command lives in its own module (cbbench/cli/<module>.py, _command_module) and
# registers itself here: (command name, module), in the order `cbbench --help` lists them.
COMMANDS = (
    ("run", "run"), ("compare", "compare"), ("gate", "gate"), ("report", "report"),
    ("serve", "serve"), ("sweep", "sweep"), ("capacity", "capacity"),
    ("calibrate", "calibrate"), ("export", "export"), ("import", "import_result"),
    ("audit", "audit"), ("schema", "schema"), ("forward", "forward"),
)
_registered: set[str] = set()


def _register(names: set[str] | None = None) -> typer.Typer:
    """The app with commands `names` registered (None: all of them). A command's module is
    imported only here: `cbbench run` does not import what `audit` or `serve` need (a
    second of imports before the first request, issue 41)."""
    for name, _ in COMMANDS:
        if (names is None or name in names) and name not in _registered:
            _command_module(name).register(_app)
            _registered.add(name)
    if (names is None or "workloads" in names) and "workloads" not in _registered:
        from cbbench.cli import workloads

        workloads.register(workloads_app)
        _registered.add("workloads")
        tidy_commands(workloads_app)
    # Every command's help reflowed and its switches without a type (cbbench/cli/help.py).
    tidy_commands(_app)
    return _app


def _command_module(name: str) -> ModuleType:  # noqa: C901 - one branch a command
    """The module of command `name`, imported on first use (written out, one import a command,
    so the import graph sees them: tests/cli/test_import_graph.py)."""
    module: ModuleType
    if name == "run":
        from cbbench.cli import run as module
    elif name == "compare":
        from cbbench.cli import compare as module
    elif name == "gate":
        from cbbench.cli import gate as module
    elif name == "report":
        from cbbench.cli import report as module
    elif name == "serve":
        from cbbench.cli import serve as module
    elif name == "sweep":
        from cbbench.cli import sweep as module
    elif name == "capacity":
        from cbbench.cli import capacity as module
    elif name == "calibrate":
        from cbbench.cli import calibrate as module
    elif name == "export":
        from cbbench.cli import export as module
    elif name == "import":
        from cbbench.cli import import_result as module
    elif name == "audit":
        from cbbench.cli import audit as module
    elif name == "schema":
        from cbbench.cli import schema as module
    elif name == "forward":
        from cbbench.cli import forward as module
    else:
        raise KeyError(name)
    return module


def __getattr__(name: str):
    """`app`: the whole command line, every command registered (tests, the surface
    snapshot); main() registers only the command it runs."""
    if name == "app":
        return _register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_named(argv: list[str]) -> set[str] | None:
    """The one command argv runs ({name}); none for --version, which prints before any
    command is looked up; or None (help, a typo: register all, so the listing and click's
    suggestions see every command)."""
    if len(argv) > 1 and (argv[1] == "workloads" or argv[1] in dict(COMMANDS)):
        return {argv[1]}
    if len(argv) > 1 and argv[1] == VERSION_FLAG:
        return set()
    return None


def main() -> None:
    _standard_fds_open()
    _printable_anywhere()
    stdout = closed_pipe.install()  # `| head -1`: the printout stops, the command does not
    code = closed_pipe.exit_code(_invoke(), stdout)
    if code == INTERRUPTED_EXIT:
        _exit_now(code)
    sys.exit(code)


def _standard_fds_open() -> None:
    """`cbbench serve <&-`: with fd 0 closed, the server's first socket got fd 0 and uvloop
    aborted on closing it at shutdown (libuv asserts fd > 2: SIGABRT, exit 134). A closed
    standard fd is /dev/null instead, as a daemon's would be, so no file or socket takes it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)


def _printable_anywhere() -> None:
    """A character the terminal's encoding lacks (PYTHONIOENCODING=latin-1 and a label 😀)
    is written escaped, not raised: the table is printed before the result is written, and
    its UnicodeEncodeError lost the run. JSON output is ASCII-escaped, so it is unchanged."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a TextIOWrapper's; not a test's
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _exit_now(code: int) -> None:
    """Leave without the interpreter's teardown: a second signal (or one before the run
    started) means quit now. Every `finally` has run by the time _invoke returns (result files
    replaced atomically, worker pools and a Ray that cbbench started shut down), so what is
    skipped is the garbage collection and module teardown that free the engine's torch objects
    in whatever state the signal left them: once in CI that teardown died with SIGABRT instead
    of exiting 130, and on a CPU engine it takes ~0.3-1 s."""
    gc.disable()  # no collection (and no torch destructor) between here and the exit
    logging.shutdown()  # what atexit would have flushed: a --log-file's last lines
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the terminal is gone (SIGHUP)
            pass
    os._exit(code)


def _wraps_an_interrupt(e: Exception) -> bool:
    """pydantic's serializer turns a KeyboardInterrupt raised inside it (Ctrl-C while a big
    result is dumped: `export`, `import`) into PydanticSerializationError, naming it only in
    its message: that was a traceback and exit 1."""
    return type(e).__name__ == "PydanticSerializationError" and "KeyboardInterrupt" in str(e)


def _invoke() -> int:
    """Run the app; every failure becomes one line on stderr and an exit code."""
    app = _register(_command_named(sys.argv))
    try:
        rv = app(standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        # A second Ctrl-C: leave now. Result files are replaced atomically, so none is partial.
        typer.echo("cbbench: interrupted", err=True)
        return INTERRUPTED_EXIT
    except Exception as e:
        if _wraps_an_interrupt(e):
            typer.echo("cbbench: interrupted", err=True)
            return INTERRUPTED_EXIT
        # Click's parse errors (bad option, bad value, missing argument) carry an exit code and
        # a message; print that one line instead of click's usage block.
        code = getattr(e, "exit_code", None)
        if hasattr(e, "format_message") and isinstance(code, int):
            message = e.format_message()
            if message:
                typer.echo(f"cbbench: error: {message}", err=True)
            else:  # no arguments at all: show the help
                ctx = getattr(e, "ctx", None)
                typer.echo(ctx.get_help() if ctx is not None else "", err=True)
            return code
        raise
    if rv == INTERRUPTED_EXIT:  # typer's own handling of a KeyboardInterrupt
        typer.echo("cbbench: interrupted", err=True)
    return rv if isinstance(rv, int) else 0
