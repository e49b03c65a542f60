"""What the GPU machine offers, for tests/gpu/gpu_check.sh (standard library only until it probes).

``env``: versions of everything the project may import; every dependency module that is
missing, found two ways (the distributions pyproject.toml declares, and every third-party
module the source imports, read with ``ast`` so nothing of the project needs to import);
the C compiler and ``Python.h`` Triton's launcher build needs.

``probe_triton``: launch one Triton kernel (the kernels package's probe). Triton builds a
small C launcher on its first launch, so a machine without a compiler or Python's headers
imports Triton fine and fails at the first kernel; the check then runs every later step with
``--attention-backend torch --no-cuda-graphs --fused-kernels off``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata as md
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("cbbench", "engine", "kernels")
# Distribution name -> import name, where they differ and the distribution may be absent (when
# it is installed, its own metadata says: import_name). A distribution is present when its
# import name imports: the H100 run called Pillow missing while PIL imported (issue 39).
MODULE_OF = {
    "Pillow": "PIL",
    "pillow": "PIL",
    "nvidia-ml-py": "pynvml",
    "prometheus-client": "prometheus_client",
    "flash-attn": "flash_attn",
    "pytest-timeout": "pytest_timeout",
}
# Imported by the source but not a distribution of their own / the project itself.
NOT_THIRD_PARTY = {"cbbench", "__future__"}
EXTRA_MODULES = ("pip", "setuptools", "wheel", "pytest", "cbbench")
COMMAND_TIMEOUT_S = 20


def import_name(dist: str) -> str:
    """The top-level module a distribution installs: MODULE_OF, else the installed
    distributions' own record (importlib.metadata.packages_distributions), else the name with
    dashes as underscores."""
    if dist in MODULE_OF:
        return MODULE_OF[dist]
    want = dist.lower().replace("_", "-")
    tops = sorted(m for m, ds in _owners().items()
                  if any(d.lower().replace("_", "-") == want for d in ds) and not m.startswith("_"))  # fmt: skip
    return tops[0] if len(tops) == 1 else dist.replace("-", "_")


@functools.cache
def _owners() -> dict[str, list[str]]:
    """{top-level module: [distributions]} of the installed distributions, read once: reading
    every distribution's RECORD takes ~0.4 s of CPU here, and collect_env asks for each of its
    ~40 declared and imported names."""
    try:
        return md.packages_distributions()
    except Exception:  # noqa: BLE001 - a broken metadata tree: fall back to the name
        return {}


def _dist_name(spec: str) -> str:
    return re.split(r"[<>=!~ \[;]", spec.strip())[0]


def declared_distributions(pyproject: Path = REPO / "pyproject.toml") -> dict[str, list[str]]:
    """{group: [distribution names]}: "required" ([project] dependencies) and each
    optional-dependencies group. tomllib where there is one (Python >= 3.11), else a small
    regex reading of the same two tables."""
    text = pyproject.read_text()
    try:
        import tomllib
    except ImportError:
        tomllib = None
    if tomllib is not None:
        project = tomllib.loads(text)["project"]
        groups = {"required": project.get("dependencies", [])}
        groups.update(project.get("optional-dependencies", {}))
    else:
        text = "\n".join(line.split("#", 1)[0] for line in text.splitlines()) + "\n["
        table = r"^\[{}\]\s*$(.*?)^\["
        proj = re.search(table.format(r"project"), text, re.S | re.M)
        opt = re.search(table.format(r"project\.optional-dependencies"), text, re.S | re.M)
        deps = re.search(r"^dependencies\s*=\s*\[(.*?)\]", proj.group(1), re.S | re.M)
        groups = {"required": re.findall(r'"([^"]+)"', deps.group(1)) if deps else []}
        for name, body in re.findall(r"^([\w-]+)\s*=\s*\[(.*?)\]", opt.group(1) if opt else "",
                                     re.S | re.M):  # fmt: skip
            groups[name] = re.findall(r'"([^"]+)"', body)
    return {g: [_dist_name(s) for s in specs] for g, specs in groups.items()}


def imported_modules(root: Path = REPO) -> dict[str, list[str]]:
    """{top-level module: [source files importing it]} for third-party imports in the source."""
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    found: dict[str, list[str]] = {}
    for folder in SOURCE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            try:
                tree = ast.parse(path.read_text(), str(path))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in stdlib or top in NOT_THIRD_PARTY:
                        continue
                    found.setdefault(top, []).append(str(path.relative_to(root)))
    return found


def module_status(name: str, really_import: bool) -> str:
    """A version, or 'MISSING (...)' with why. ``really_import``: import it (what the engine
    needs at run time must import, not only be present); else look it up (fast)."""
    mod = None
    try:
        if really_import:
            mod = importlib.import_module(name)
        elif importlib.util.find_spec(name) is None:
            return "MISSING (not found)"
    except Exception as exc:  # noqa: BLE001 - any failure to import is a finding
        return f"MISSING ({type(exc).__name__}: {str(exc)[:160]})"
    dist = next((d for d, m in MODULE_OF.items() if m == name), name)
    try:
        return md.version(dist)
    except Exception:  # noqa: BLE001
        return str(getattr(mod, "__version__", "?"))


def c_compiler() -> dict:
    """The compiler Triton's launcher build would use (CC, else gcc, else clang) and cc."""
    info = {"CC": os.environ.get("CC")}
    for name in ("cc", "gcc", "clang"):
        info[name] = shutil.which(name)
    chosen = info["CC"] or info["gcc"] or info["clang"] or info["cc"]
    info["chosen"] = chosen
    version = None
    if chosen:
        try:
            out = subprocess.run(
                [chosen, "--version"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
            )
            version = (out.stdout or out.stderr).strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, IndexError) as exc:
            version = f"failed: {exc}"
    info["version"] = version  # `cc --version`, first line; None: no compiler
    return info


def python_headers() -> dict:
    """Where Python.h should be, as Triton looks for it, and whether it is there."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # Debian's pip scheme: the headers live under posix_prefix
        scheme = "posix_prefix"
    include = sysconfig.get_paths(scheme=scheme)["include"]
    header = Path(include) / "Python.h"
    return {"include_dir": include, "found": header.is_file()}


def collect_env() -> dict:
    declared = declared_distributions()
    imported = imported_modules()
    required = {import_name(d) for d in declared.get("required", [])}
    runtime = required | set(imported)  # imported for real; test-only tools looked up
    modules: dict[str, str] = {}
    for dists in declared.values():
        for dist in dists:
            name = import_name(dist)
            modules.setdefault(name, module_status(name, name in runtime))
    for name in [*imported, *EXTRA_MODULES]:
        modules.setdefault(name, module_status(name, name in runtime))
    missing = sorted(m for m, v in modules.items() if v.startswith("MISSING"))
    info: dict = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "modules": modules,
        # Every missing module of the project's dependencies, each with who needs it.
        "missing_modules": {
            m: {
                "required": m in required,
                "imported_by": sorted(set(imported.get(m, [])))[:8],
            }
            for m in missing
        },
        "declared_distributions": declared,
        "c_compiler": c_compiler(),
        "python_h": python_headers(),
    }
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["device_name"] = torch.cuda.get_device_name(0)
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            props = torch.cuda.get_device_properties(0)
            info["memory_gib"] = round(props.total_memory / 2**30, 1)
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = repr(exc)
    return info


def probe_triton(device: str) -> str | None:
    """None when one Triton kernel launched and wrote its value on ``device``, else why not
    (one line)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        import torch

        from cbbench.kernels.triton_probe import launch_failure
    except Exception as exc:  # noqa: BLE001
        return f"triton probe could not import: {type(exc).__name__}: {str(exc)[:200]}"
    return launch_failure(torch.device(device))
