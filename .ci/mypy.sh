#!/usr/bin/env bash
# The type checker over the whole library: cbbench/, engine/, kernels/ and workloads/, 0 errors.
#
# engine/, kernels/ and workloads/ install as cbbench.engine, cbbench.kernels and
# cbbench.workloads (pyproject's package-dir), which mypy cannot read from the source tree: it
# checks a folder of links laid out as the installed package, so module names and imports
# match. Configuration: [tool.mypy] in pyproject.toml.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VIEW="$(mktemp -d)"
trap 'rm -rf "$VIEW"' EXIT
mkdir "$VIEW/cbbench"
for entry in "$REPO"/cbbench/*; do ln -s "$entry" "$VIEW/cbbench/"; done
ln -s "$REPO/engine" "$VIEW/cbbench/engine"
ln -s "$REPO/kernels" "$VIEW/cbbench/kernels"
ln -s "$REPO/workloads" "$VIEW/cbbench/workloads"
cd "$VIEW"
# No cache folder in the repo, nor one shared between runs of different trees.
python -m mypy --config-file "$REPO/pyproject.toml" --cache-dir "$VIEW/.mypy_cache" -p cbbench
