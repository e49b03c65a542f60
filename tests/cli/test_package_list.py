"""Every package folder is in pyproject.toml's package list.

setuptools installs only the packages named there (the package-dir mapping of engine/ and
kernels/ rules out automatic discovery), so a subpackage left off the list still imports from an
editable checkout and silently goes missing from a wheel or a plain `pip install .`."""

from __future__ import annotations

import re

from test_import_graph import PACKAGES, ROOT


def listed_packages() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^packages = \[(.*?)\]", text, re.S | re.M)
    assert block, "pyproject.toml has no packages list"
    return set(re.findall(r'"([\w.]+)"', block.group(1)))


def package_folders() -> set[str]:
    found = set()
    for folder, package in PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *parts]))
    return found


def test_every_package_folder_is_listed():
    folders = package_folders()
    assert {"cbbench", "cbbench.engine.core", "cbbench.analysis.summary"} <= folders
    missing = sorted(folders - listed_packages())
    assert not missing, "add to pyproject.toml's packages: " + ", ".join(missing)


def test_every_listed_package_has_a_folder():
    stale = sorted(p for p in listed_packages() - package_folders() if p != "cbbench.workloads")
    assert not stale, "pyproject.toml lists packages with no folder: " + ", ".join(stale)
