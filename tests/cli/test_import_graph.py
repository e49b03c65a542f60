"""The layering, read from the source with ``ast`` (nothing is imported): no import cycle among
the modules of cbbench/, engine/ and kernels/, and every import points down the layers.

- No cycle at all: neither among module-level imports (those that run when the module loads)
  nor once imports inside functions are counted too (a deferred import cannot deadlock a load,
  but a circle of them is still two modules that each need the other). Only imports under
  ``if TYPE_CHECKING:`` are left out: they never run.
- Only cbbench/cli/ imports cbbench.cli: library modules never depend on a command module.
- engine/ (cbbench.engine) never imports the cbbench front; kernels/ (cbbench.kernels) never
  imports the engine or the front; the engine core (engine/core) imports nothing from the
  simulator (engine/sim) or the torch engine (engine/torch), which build on it.
- The front's packages are layered (FRONT_LAYERS): a module imports only from its own layer or
  a lower one (targets/ never reaches up into distributed/, which runs targets on workers).
- No circle even through imports under ``if TYPE_CHECKING:``: a module that names another's
  class for its annotations still depends on it.
The layer rules count every import, deferred and typing-only ones included: a lazy import is
still a dependency.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Source folder -> the package it installs as (pyproject.toml's package-dir).
PACKAGES = {"cbbench": "cbbench", "engine": "cbbench.engine", "kernels": "cbbench.kernels"}
CLI = "cbbench.cli"
MAIN = "cbbench.__main__"  # `python -m cbbench`: the CLI's entry point, above it
ENGINE = "cbbench.engine"
KERNELS = "cbbench.kernels"
ENGINE_CORE = "cbbench.engine.core"
ENGINE_ABOVE_CORE = ("cbbench.engine.sim", "cbbench.engine.torch")
# The front, bottom to top: each package (or top-level module) may import its own layer and
# those below it (the engine and kernels sit under all of them).
FRONT_LAYERS = [
    {"cbbench", "cbbench.errors", "cbbench.fd_limit", "cbbench.clock_offset", "cbbench.finite",
     "cbbench.workloads"},
    {"cbbench.schema", "cbbench.load", "cbbench.analysis"},
    {"cbbench.targets", "cbbench.server"},
    {"cbbench.distributed"},
    {"cbbench.options"},
    {"cbbench.bench"},
    {"cbbench.importers", "cbbench.report", "cbbench.export"},
    {CLI},
    {MAIN},
]


@dataclass(frozen=True)
class Import:
    target: str  # the imported module, resolved to a module of this project
    line: int
    top_level: bool  # runs when the importing module loads
    typing_only: bool = False  # under `if TYPE_CHECKING:`: never runs


def _module_name(folder: str, path: Path) -> tuple[str, bool]:
    """(dotted module name, whether it is a package's __init__)."""
    parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join([PACKAGES[folder], *parts]), is_package


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name, is_package = _module_name(folder, path)
            found[name] = (path, is_package)
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(body: list[ast.stmt], top_level: bool, typing_only: bool = False):
    """(import statement, runs at load, typing only) for every import in ``body``, nested ones
    included."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, top_level, typing_only
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(node.body, False, typing_only)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.body, False, True)
            yield from _walk(node.orelse, top_level, typing_only)
        else:
            # Class bodies, try/except, with, if/else at module level all run at load.
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list) and children and isinstance(children[0], ast.AST):
                    yield from _walk(children, top_level, typing_only)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str) -> list[Import]:
    path, is_package = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node, top_level, typing_only in _walk(tree.body, True):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _resolve(module, is_package, node)
            # `from pkg import name`: the submodule pkg.name when it is one, else pkg itself.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        for target in dict.fromkeys(targets):
            if target in MODULES:
                out.append(Import(target, node.lineno, top_level, typing_only))
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(importer_filter, target_filter) -> list[str]:
    return [
        f"{MODULES[m][0].relative_to(ROOT)}:{imp.line} imports {imp.target}"
        for m, imps in GRAPH.items()
        if importer_filter(m)
        for imp in imps
        if target_filter(imp.target)
    ]


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One import cycle (as a path that ends where it starts), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = GREY
        stack.append(node)
        for nxt in graph[node]:
            if color[nxt] == GREY:
                return [*stack[stack.index(nxt) :], nxt]
            if color[nxt] == WHITE:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        color[node] = BLACK
        return None

    for node in graph:
        if color[node] == WHITE:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_the_modules_and_their_imports():
    # Guards the checks below against passing on an empty graph.
    assert {"cbbench.cli.app", "cbbench.engine.core.scheduler", "cbbench.kernels"} <= set(MODULES)
    sched = {i.target for i in GRAPH["cbbench.engine.core.scheduler"]}
    assert "cbbench.engine.core.block_manager" in sched  # a relative import, resolved
    app = {i.target for i in GRAPH["cbbench.cli.app"]}
    assert "cbbench.cli.run" in app  # `from cbbench.cli import run`: the submodule


def test_no_import_cycle_among_module_level_imports():
    graph = {m: [i.target for i in imps if i.top_level] for m, imps in GRAPH.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_counting_imports_inside_functions():
    graph = {m: [i.target for i in imps if not i.typing_only] for m, imps in GRAPH.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle (deferred imports included): " + " -> ".join(cycle)


def test_no_import_cycle_counting_typing_only_imports():
    # Every import counted, those under TYPE_CHECKING too: the last circle
    # (targets/http <-> targets/http_sessions, issue 41) went when http_sessions stopped
    # subclassing http's runner.
    graph = {m: [i.target for i in imps] for m, imps in GRAPH.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle (typing-only imports included): " + " -> ".join(cycle)


def _layer_of(module: str) -> int | None:
    for i, layer in enumerate(FRONT_LAYERS):
        if any(_in(module, p) if p != "cbbench" else module == p for p in layer):
            return i
    return None


def test_every_front_module_has_a_layer():
    unplaced = [m for m in MODULES
                if not (_in(m, ENGINE) or _in(m, KERNELS)) and _layer_of(m) is None]
    assert not unplaced, "add to FRONT_LAYERS: " + ", ".join(unplaced)


def test_front_imports_point_down_the_layers():
    bad = [
        f"{MODULES[m][0].relative_to(ROOT)}:{imp.line} imports {imp.target}"
        for m, imps in GRAPH.items()
        if (lm := _layer_of(m)) is not None
        for imp in imps
        if (lt := _layer_of(imp.target)) is not None and lt > lm
    ]
    assert not bad, "an import up the front's layers (FRONT_LAYERS):\n" + "\n".join(bad)


def test_the_layer_rules_see_an_upward_import():
    # Guards the check above against a layer table that places nothing.
    assert _layer_of("cbbench.targets.http") < _layer_of("cbbench.distributed.worker")
    assert _layer_of("cbbench.clock_offset") == 0 and _layer_of("cbbench.cli.app") == 7
    assert _layer_of("cbbench.engine.core.engine") is None


def test_the_graph_tells_deferred_and_typing_only_imports_apart():
    # Guards the check above: a function-level import is counted, a TYPE_CHECKING one is not.
    def kinds(module: str, target: str) -> set[tuple[bool, bool]]:
        return {(i.top_level, i.typing_only) for i in GRAPH[module] if i.target == target}

    assert kinds("cbbench.engine.build", "cbbench.engine.sim.replicas") == {(False, False)}
    assert kinds("cbbench.targets.request", "cbbench.targets.stream_pool") == {(False, True)}
    # feed.py imports StepFailed at load and Engine only for annotations.
    assert kinds("cbbench.engine.core.feed", "cbbench.engine.core.engine") == {
        (True, False), (False, True),
    }  # fmt: skip


def test_find_cycle_finds_one():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) in (
        ["a", "b", "c", "a"], ["b", "c", "a", "b"], ["c", "a", "b", "c"],
    )  # fmt: skip
    assert find_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


@pytest.mark.parametrize(
    ("rule", "importer", "forbidden"),
    [
        (
            "only the CLI (and its entry point) imports command modules",
            lambda m: not (_in(m, CLI) or m == MAIN),
            lambda t: _in(t, CLI),
        ),
        (
            "the engine never imports the cbbench front",
            lambda m: _in(m, ENGINE),
            lambda t: not (_in(t, ENGINE) or _in(t, KERNELS)),
        ),
        (
            "the engine core imports nothing from the simulator or the torch engine",
            lambda m: _in(m, ENGINE_CORE),
            lambda t: any(_in(t, p) for p in ENGINE_ABOVE_CORE),
        ),
        (
            "targets never import distributed (the workers run targets, not the reverse)",
            lambda m: _in(m, "cbbench.targets"),
            lambda t: _in(t, "cbbench.distributed"),
        ),
        (
            "kernels never import the engine or the front",
            lambda m: _in(m, KERNELS),
            lambda t: not _in(t, KERNELS),
        ),
    ],
)
def test_imports_point_down_the_layers(rule, importer, forbidden):
    bad = _violations(importer, forbidden)
    assert not bad, f"{rule}:\n" + "\n".join(bad)
