"""Issue 23's before/after figures for one source tree: library and test lines and files, the
largest function's complexity, `duplicates` pairs, and the longest import chain.

    python results/front_figures.py TREE [TREE ...]   # prints one markdown column per tree

Lines are every line of every .py file (blank and comment lines included). Complexity is
ruff's C901 (McCabe) with every `noqa` ignored, so a function marked "to split" still counts.
The import graph is tests/cli/test_import_graph.py's (ast, nothing imported), pointed at each
tree; the chain is the longest path in modules, once over imports that run at load and once
counting imports inside functions too (a circle of modules counts as one step, so a tree with
cycles gets a finite figure). `duplicates` is the project's tool (pairs of places sharing six or
more lines, over the whole tree, tests included).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
LIBRARY = ("cbbench", "engine", "kernels")
DUPLICATES_SECONDS = "300"


def py_files(root: Path, folders) -> list[Path]:
    return [p for f in folders for p in sorted((root / f).rglob("*.py"))]


def line_count(files: list[Path]) -> int:
    return sum(len(p.read_text(errors="replace").splitlines()) for p in files)


def largest_complexity(root: Path) -> tuple[int, str]:
    out = subprocess.run(
        ["ruff", "check", "--isolated", "--select", "C901", "--ignore-noqa", "--no-cache",
         "--config", "lint.mccabe.max-complexity = 0", "--output-format", "json",
         *[str(root / f) for f in LIBRARY]],
        capture_output=True, text=True,
    ).stdout
    best = (0, "")
    for d in json.loads(out):
        m = re.search(r"`(.+)` is too complex \((\d+) >", d["message"])
        if m and int(m.group(2)) > best[0]:
            best = (int(m.group(2)), m.group(1))
    return best


def duplicate_pairs(root: Path) -> str:
    out = subprocess.run(["duplicates", "--repo", str(root), "--most", "1", "--seconds",
                          DUPLICATES_SECONDS], capture_output=True, text=True).stdout
    first = out.splitlines()[0] if out else "?"
    m = re.search(r"(\d+) pairs?", first)
    return m.group(1) if m else first


def _graph_module():
    path = HERE / "tests" / "cli" / "test_import_graph.py"
    spec = importlib.util.spec_from_file_location("import_graph", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def longest_chain(root: Path, load_time_only: bool) -> int:
    g = _graph_module()
    g.ROOT = root
    g.MODULES = g._modules()
    edges = {m: sorted({i.target for i in g.imports_of(m) if not i.typing_only
                        and (i.top_level or not load_time_only) and i.target != m})
             for m in g.MODULES}
    comp = _components(edges)
    dag: dict[int, set[int]] = {c: set() for c in set(comp.values())}
    for m, targets in edges.items():
        dag[comp[m]].update(comp[t] for t in targets if comp[t] != comp[m])
    memo: dict[int, int] = {}

    def depth(c: int) -> int:
        if c not in memo:
            memo[c] = 1 + max((depth(d) for d in dag[c]), default=0)
        return memo[c]

    sys.setrecursionlimit(10_000)
    return max(depth(c) for c in dag)


def _components(edges: dict[str, list[str]]) -> dict[str, int]:
    """Tarjan's strongly connected components: module -> component id."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comp: dict[str, int] = {}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:  # v roots a component: it is what the stack holds above v
            while True:
                w = stack.pop()
                on.discard(w)
                comp[w] = index[v]
                if w == v:
                    break

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)
    return comp


# Issue 36's string-key lookups: a subscript by a string literal (`x["key"]`, `x['key']`) or a
# `.get("key"` call, in the front's own code (cbbench/). Comments and docstrings count too when
# they hold one; the figure is a trend, counted the same way in every tree.
STRING_KEY = re.compile(r"""\[\s*(?:"[^"\n]*"|'[^'\n]*')\s*\]|\.get\(\s*["']""")


def string_key_lookups(files: list[Path]) -> int:
    return sum(len(STRING_KEY.findall(p.read_text(errors="replace"))) for p in files)


def figures(root: Path) -> dict[str, str]:
    lib = py_files(root, LIBRARY)
    tests = py_files(root, ("tests",))
    front = py_files(root, ("cbbench",))
    analysis = py_files(root, ("cbbench/analysis",))
    cx, name = largest_complexity(root)
    return {
        "library .py files / lines (cbbench, engine, kernels)": f"{len(lib)} / {line_count(lib):,}",
        "front (cbbench/) .py files / lines": f"{len(front)} / {line_count(front):,}",
        "analysis/ modules (no __init__), in folders": (
            f"{sum(p.name != '__init__.py' for p in analysis)}, "
            f"{len({p.parent for p in analysis})}"),
        "string-key lookups in cbbench/ (`x[\"...\"]`, `.get(\"...\"`)": (
            f"{string_key_lookups(front):,}"),
        "test .py files / lines": f"{len(tests)} / {line_count(tests):,}",
        "largest library function's complexity (noqa ignored)": f"{cx} ({name})",
        "`duplicates` pairs (whole tree)": duplicate_pairs(root),
        "longest import chain, all imports / load-time": (
            f"{longest_chain(root, False)} / {longest_chain(root, True)}"),
    }


def main(trees: list[str]) -> None:
    cols = [figures(Path(t).resolve()) for t in trees]
    print("| figure | " + " | ".join(trees) + " |")
    print("|---|" + "---|" * len(trees))
    for key in cols[0]:
        print(f"| {key} | " + " | ".join(c[key] for c in cols) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
