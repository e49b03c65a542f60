#!/usr/bin/env bash
# The simulator against real CPU runs (issue 14): calibrate on one real run, predict another.
#
#   results/sim_accuracy/run.sh [TAG]     (from the repo root; ~15-25 min on a busy 2-core host)
#
# 1. a real torch run of the 'small' preset on ShareGPT (300 requests)    -> calibration data
# 2. cbbench calibrate                                                      -> profile
# 3. a real torch run of a DIFFERENT workload and --max-num-seqs, given the profile, so its
#    own summary reports the simulator's per-iteration error (summary.engine.sim_error)
# 4. the same request set through the simulator on the calibrated CPU: the prediction
# 5. compare 3 and 4; summarize.py writes the errors of TTFT p50, TPOT p50, throughput
#
# Real runs use one intra-op thread (OMP_NUM_THREADS=1): on an oversubscribed host, torch's
# two spinning OpenMP threads made iteration times 2-3x longer and far noisier. Everything
# goes to $WORK (the full results are MBs); `table.py $WORK ...` makes the committed table's
# row (results/sim_accuracy/table.md: one table for every repeat, not a folder each).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:-$(date +%Y%m%d-%H%M)}
WORK=${WORK:-$(mktemp -d)}
OUT=$WORK/$TAG
mkdir -p "$OUT"
export OMP_NUM_THREADS=1

# Both runs send every request at t = 0 (vLLM's default): the device, not the arrival
# process, sets the pace, so TTFT (queueing included), TPOT and throughput all test it.
CAL=(--workload sharegpt --num-requests 300 --request-rate 20 --seed 0)
TARGET=(--workload long-prompt --num-requests 60 --seed 1 --max-num-seqs 8 --max-model-len 8192)
SMALL=(--model small --dtype fp32)

{ echo "before calibration run: $(uptime)"; } > "$OUT/uptime.txt"
cbbench run --engine torch --device cpu "${SMALL[@]}" "${CAL[@]}" --label real-sharegpt \
  --output "$WORK/cal.json" > /dev/null
echo "after calibration run:  $(uptime)" >> "$OUT/uptime.txt"
cbbench calibrate "$WORK/cal.json" --out "$OUT/profile.json" > "$OUT/calibrate.txt"
cbbench run --engine torch --device cpu "${SMALL[@]}" "${TARGET[@]}" --label real-long-prompt \
  --gpu-profile "$OUT/profile.json" --output "$WORK/real.json" > /dev/null
echo "after target run:       $(uptime)" >> "$OUT/uptime.txt"
cbbench run --engine sim --gpu-profile "$OUT/profile.json" "${TARGET[@]}" --label sim-long-prompt \
  --output "$WORK/sim.json" > /dev/null
# The same prediction through --replay (the recorded run's exact requests and arrivals).
cbbench run --engine sim --gpu-profile "$OUT/profile.json" --replay "$WORK/real.json" \
  --label sim-replay --output "$WORK/replay.json" > /dev/null
cbbench compare "$WORK/real.json" "$WORK/sim.json" "$WORK/replay.json" > "$OUT/compare.txt"
python results/sim_accuracy/summarize.py "$WORK/cal.json" "$WORK/real.json" "$WORK/sim.json" \
  "$WORK/replay.json" > "$OUT/summary.md"
cat "$OUT/summary.md"
echo "full results: $WORK; its row: python results/sim_accuracy/table.py $OUT"
