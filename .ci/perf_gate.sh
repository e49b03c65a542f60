#!/usr/bin/env bash
# The project's own performance gate: deterministic simulated benchmarks (sim engine, fixed
# seed: no noise) compared with the committed baselines, so a scheduler change that worsens
# TTFT/TPOT/throughput fails CI. Two points: saturation (all requests at t=0: throughput and
# queueing) and a moderate Poisson load (latency).
#
#   .ci/perf_gate.sh              run and gate against results/baselines/ (exit 1 on regression)
#   .ci/perf_gate.sh --refresh    deliberately accept the current figures as the new baselines
#
# BASELINE_DIR and OUT_DIR may be set to gate against other files (tests use this).
set -euo pipefail
cd "$(dirname "$0")/.."
BASELINE_DIR=${BASELINE_DIR:-results/baselines}
OUT_DIR=${OUT_DIR:-$(mktemp -d)}

bench() {  # bench NAME RATE OUTPUT
  cbbench run --workload sharegpt --engine sim --gpu h200 --model llama-3-8b \
    --num-requests 500 --request-rate "$2" --seed 0 --label "ci-$1" --summary-only \
    --output "$3" > /dev/null
}

POINTS="saturation:inf poisson20:20"
status=0
for point in $POINTS; do
  name=${point%%:*}
  rate=${point#*:}
  base="$BASELINE_DIR/sim_h200_sharegpt_$name.json"
  if [ "${1:-}" = "--refresh" ]; then
    bench "$name" "$rate" "$base"
    echo "baseline refreshed: $base (commit it with the change that moved it)"
    continue
  fi
  bench "$name" "$rate" "$OUT_DIR/$name.json"
  echo "== perf gate: $name (request rate $rate)"
  cbbench gate "$OUT_DIR/$name.json" --baseline "$base" --markdown "$OUT_DIR/$name.md" \
    || status=$?
  [ "$status" -le 1 ] || exit "$status"  # unusable input: stop at once
done
exit "$status"
