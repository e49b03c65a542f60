#!/usr/bin/env bash
# The type checker over the engine, the kernels and the front modules typed so far.
#
# engine/ and kernels/ install as cbbench.engine and cbbench.kernels (pyproject's package-dir),
# which mypy cannot read from the source tree: it checks a folder of links laid out as the
# installed package, so module names and imports match. Configuration: [tool.mypy] in
# pyproject.toml. Add a front module to FRONT once it checks clean (with what it imports).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VIEW="$(mktemp -d)"
trap 'rm -rf "$VIEW"' EXIT
mkdir "$VIEW/cbbench"
for entry in "$REPO"/cbbench/*; do ln -s "$entry" "$VIEW/cbbench/"; done
ln -s "$REPO/engine" "$VIEW/cbbench/engine"
ln -s "$REPO/kernels" "$VIEW/cbbench/kernels"

FRONT=(
  cbbench cbbench.analysis cbbench.analysis.compact cbbench.analysis.compact.compact_convert
  cbbench.analysis.compact.compact_run cbbench.analysis.comparison
  cbbench.analysis.comparison.gate cbbench.analysis.comparison.windows cbbench.analysis.records
  cbbench.analysis.result cbbench.analysis.server_side cbbench.analysis.server_side.prom_text
  cbbench.analysis.server_side.server_cache cbbench.analysis.server_side.speculative_scrape
  cbbench.analysis.summary cbbench.analysis.summary.histogram
  cbbench.analysis.summary.percentiles cbbench.analysis.summary.slo
  cbbench.analysis.summary.speculative cbbench.analysis.summary.telemetry cbbench.bench
  cbbench.bench.dcgm cbbench.bench.forward cbbench.bench.nvml_gpm cbbench.bench.nvml_sampler
  cbbench.bench.roofline cbbench.clock_offset cbbench.distributed cbbench.distributed.plan
  cbbench.errors cbbench.fd_limit cbbench.load cbbench.load.cancel cbbench.load.chat_template
  cbbench.load.delays cbbench.load.hash_blocks cbbench.load.images cbbench.load.interrupts
  cbbench.load.jsonl cbbench.load.limits cbbench.load.session_dag cbbench.report.check
  cbbench.schema cbbench.schema.base cbbench.schema.capacity cbbench.schema.run
  cbbench.schema.sweep cbbench.server.engine_events cbbench.server.limits
  cbbench.server.paced_clock cbbench.server.prometheus cbbench.server.request_log
  cbbench.server.text cbbench.targets cbbench.targets.apis cbbench.targets.apis.responses_stream
  cbbench.targets.balance cbbench.targets.gc_freeze cbbench.targets.hooks
  cbbench.targets.options cbbench.targets.read_buffers cbbench.targets.request
  cbbench.targets.sse cbbench.targets.transport
)
args=(-p cbbench.engine -p cbbench.kernels)
for m in "${FRONT[@]}"; do args+=(-m "$m"); done
cd "$VIEW"
# No cache folder in the repo, nor one shared between runs of different trees.
python -m mypy --config-file "$REPO/pyproject.toml" --cache-dir "$VIEW/.mypy_cache" "${args[@]}"
