#!/usr/bin/env bash
# One-shot GPU check for a machine with one H200 (or any CUDA GPU): under 9 minutes in all.
#
#   bash tests/gpu/gpu_check.sh [OUT_DIR]        # OUT_DIR defaults to $OUT, else results/gpu/check-<time>
#
# OUT_DIR receives exactly four files (the GPU machine hands back at most 8 files of $OUT):
#   gpu_check.tar.gz  the whole work folder (gpu_check/: every log, JSON and the summary),
#   summary.json, summary.md, steps.tsv  beside it, so they come back even if the archive is lost.
# The steps run in a work folder under $TMPDIR (removed at exit unless GPU_CHECK_KEEP_WORK=1);
# the four files are refreshed after every step, so a check stopped from outside still hands
# back what it had. summary.md is the script's last output: the run's tail holds it.
#
# Steps (each under `timeout`, each one's exit code and time recorded in steps.tsv; a
# failing step never stops the ones after it; caps in seconds, all clipped so the whole script
# ends within GPU_CHECK_TOTAL_S = 540 s):
#   nvidia_smi, env (45)  nvidia-smi; python, every dependency module (missing ones listed with
#              who imports them), `cc --version` and whether Python.h is found -> env.json
#   install (60)  pip install --no-deps --no-build-isolation --no-index -e .  (never downloads;
#              falls back to a PYTHONPATH view of the package if pip cannot install)
#   import, import_cli  cbbench's engine imports; the CLI (cbbench.cli.app) imports, else the
#              ShareGPT steps go through tests/gpu/bench_gpu.py run
#   triton_probe (60)  one Triton kernel launch (Triton builds a C launcher on its first launch).
#              If it fails, every later step runs with --attention-backend torch
#              --no-cuda-graphs --fused-kernels off, and the summary says so in one line.
#   pytest (180)  pytest -m cuda on the test files that mark a test cuda -> pytest_cuda.log / .xml
#              (--durations shows the slowest, for sizing this cap). Cold-cache Triton compiles
#              dominate (estimated from the constexpr combinations, not yet measured):
#              test_kernels.py ~40-50 (unified kernel: 3 dtypes x 2 block sizes x 3 GQA ratios
#              x decode/prefill query tiles = 36, plus split-K pairs where the chooser splits),
#              test_model_runner_cuda.py ~15, test_fused_cuda.py 14 (fused RMSNorm x2, RoPE x2,
#              SiLU-mul, split-K pair at Llama-3-8B shapes, x bf16/fp16), test_fused_engine_hf.py
#              ~8 (fp32, vs HF): ~80-90 at ~1-2 s each, ~150 s with the tests themselves. The
#              bf16 block-16 Llama-shape ones are the decode and ShareGPT steps' own, so
#              Triton's on-disk cache spares those steps the compile. The caps sum to more than
#              the 540 s budget on purpose: a step that runs long shortens the ones after it
#              (the expected total is ~510 s: pytest ~150, decode ~120, ShareGPT 200 requests
#              ~25 + ~30 (estimated from 1000 in ~90 + ~100), calibrate + sim_static ~10, the
#              anchor what is left, ~150; not yet measured).
#   decode (150)  tests/gpu/bench_gpu.py decode: llama-3-8b random weights, bf16, decode step time at
#              batch 1/16/64/256, context 512, with and without CUDA graphs, fused and unfused
#              layer kernels side by side, torch-backend rows, floor and MBU, every backend vs
#              reference, and the fused layer kernels vs the unfused ones on the same fed
#              tokens (backends_agree's triton+fused row) -> decode.json/.md
#   sharegpt (100)  cbbench run --workload sharegpt --engine torch --model llama-3-8b
#              --num-requests 200 -> sharegpt_h200.json (the anchor's 200 requests)
#   calibrate (30)  cbbench calibrate sharegpt_h200.json --out profile.json: the simulator
#              fitted to the continuous run (2.5 s for ~1.8k iterations on this project's CPU;
#              ~7 s for 15k: the staged fit)
#   static (110)  the same run with --scheduler static (and --gpu-profile profile.json when the
#              calibration worked, so its sim_error is the calibrated simulator's)
#              -> sharegpt_h200_static.json
#   sim_static (30)  cbbench run --engine sim --gpu-profile profile.json --replay
#              sharegpt_h200_static.json -> sim_static.json: the calibrated simulator predicts
#              the static run (same requests, arrivals, scheduling; ~1 s on a CPU)
#   anchor (150)  tests/gpu/bench_gpu.py anchor: Hugging Face generate on the same GPU and model
#              (random weights): static batches of the same ShareGPT requests (eager, static
#              cache; half the step's time at most), then decode ms/step at batch 1 and 16 with a
#              static cache and torch.compile (gpt-fast's recipe) -> anchor.json; summary.json's
#              ratio_to_anchor holds cbbench / HF. Last: it gets what the budget leaves, and a
#              part it cannot finish is null with the reason.
#   summary (20)  tests/gpu/bench_gpu.py summarize -> summary.json, summary.md (sim_accuracy: TTFT
#              p50, TPOT p50, output throughput of the static run, real vs predicted)
#
# A run stopped by its timeout gets SIGTERM first: `cbbench run` then stops dispatching, lets
# in-flight requests finish for a few seconds and still writes its result (interrupted: true).
#
# Knobs (environment): PYTHON (interpreter; default python3, else python), GPU_CHECK_TOTAL_S (whole budget, default 540),
# GPU_CHECK_SKIP_INSTALL=1, GPU_CHECK_MODEL (default llama-3-8b), GPU_CHECK_DEVICE (cuda),
# GPU_CHECK_NUM_REQUESTS (200), GPU_CHECK_SEED (unset: cbbench's default; set: --seed for every
# ShareGPT run and the anchor's requests, e.g. a draw without a 689-token output for the smoke),
# GPU_CHECK_ANCHOR_CAP_S (150), GPU_CHECK_ANCHOR_ARGS (extra args for bench_gpu.py anchor), GPU_CHECK_DECODE_ARGS (extra args for bench_gpu.py decode),
# GPU_CHECK_PYTEST_ARGS (replaces "-m cuda"), GPU_CHECK_FORCE_SHADOW=1 (test the no-install
# fallback), GPU_CHECK_FORCE_TRITON_FAIL=1 (act as if the Triton probe failed),
# GPU_CHECK_CAP_SCALE (multiplies every step's cap; for the smoke test on a shared CPU). The CPU smoke
# test of the flow itself (tests/engine/test_gpu_check.py runs it in CI):
#   GPU_CHECK_SKIP_INSTALL=1 GPU_CHECK_DEVICE=cpu GPU_CHECK_MODEL=tiny GPU_CHECK_NUM_REQUESTS=8 \
#     GPU_CHECK_SEED=35 GPU_CHECK_DECODE_ARGS="--dry-run --dtype fp32" bash tests/gpu/gpu_check.sh /tmp/gpu-check-cpu
set -u
set -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO" || exit 2

RESULT_DIR="${1:-${OUT:-$REPO/results/gpu/check-$(date -u +%Y%m%d-%H%M%S)}}"
mkdir -p "$RESULT_DIR" || { echo "cannot create $RESULT_DIR" >&2; exit 2; }
RESULT_DIR="$(cd "$RESULT_DIR" && pwd)"
# The steps write into a work folder outside RESULT_DIR; RESULT_DIR gets only RESULT_FILES (the
# GPU machine hands back at most 8 files of $OUT): the archive of the whole work folder, and the
# summary and step table beside it, so they come back even if the archive does not.
WORK_PARENT="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")" || { echo "cannot mktemp" >&2; exit 2; }
OUT_DIR="$WORK_PARENT/gpu_check"
mkdir -p "$OUT_DIR"
ARCHIVE="gpu_check.tar.gz"
RESULT_FILES=(summary.json summary.md steps.tsv)

TOTAL_S="${GPU_CHECK_TOTAL_S:-540}"
MODEL="${GPU_CHECK_MODEL:-llama-3-8b}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
NUM_REQUESTS="${GPU_CHECK_NUM_REQUESTS:-400}"  # the HF anchor runs the same requests
# 32 batch slots: 400 requests at t=0 do not fit one batch, so static and continuous batching
# differ (256 slots took all 200 requests in one batch on the H100: both took 1,558 iterations).
MAX_NUM_SEQS="${GPU_CHECK_MAX_NUM_SEQS:-32}"
ANCHOR_CAP_S="${GPU_CHECK_ANCHOR_CAP_S:-200}"
ANCHOR_DECODE_S="${GPU_CHECK_ANCHOR_DECODE_S:-150}"  # the compiled decode part, compile included
# The Poisson point: this fraction of the continuous run's request throughput (its capacity at
# MAX_NUM_SEQS), POISSON_REQUESTS requests, each scheduler; last, it gets what is left.
POISSON_LOAD="${GPU_CHECK_POISSON_LOAD:-0.7}"
POISSON_REQUESTS="${GPU_CHECK_POISSON_REQUESTS:-150}"
ANCHOR_ARGS="${GPU_CHECK_ANCHOR_ARGS:-}"
SEED_ARGS=()  # the request draw: every ShareGPT run and the anchor's requests take the same one
[ -n "${GPU_CHECK_SEED:-}" ] && SEED_ARGS=(--seed "$GPU_CHECK_SEED")
DECODE_ARGS="${GPU_CHECK_DECODE_ARGS:-}"
PYTEST_ARGS="${GPU_CHECK_PYTEST_ARGS:--m cuda}"
CAP_SCALE="${GPU_CHECK_CAP_SCALE:-1}"  # multiplies every step's cap (a slow, shared CPU)
RESERVE_S=25      # kept back for the summary and for timeout's kill grace
KILL_GRACE_S=15   # after SIGTERM, SIGKILL this much later
START_S=$(date +%s)
DEADLINE_S=$((START_S + TOTAL_S))
export PYTHONUNBUFFERED=1

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif command -v python3 >/dev/null 2>&1; then PY=python3   # the image promises python3
else PY=python; fi
PYFLAGS=()        # becomes (-P) in the PYTHONPATH fallback (do not import ./cbbench from the cwd)
SHADOW=""
SHADOW_LINKS=()

STEPS="$OUT_DIR/steps.tsv"
printf 'step\trc\tseconds\tlimit_s\tnote\n' > "$STEPS"

log() { echo "[gpu_check $(date -u +%H:%M:%S) +$(( $(date +%s) - START_S ))s] $*"; }

# pack: the work folder -> RESULT_DIR/gpu_check.tar.gz, and RESULT_FILES copied beside it;
# each written to a temporary name and renamed, so a kill mid-pack leaves the previous one.
# Run after every step: a check stopped from outside still hands back what it had.
pack() {
    local f
    tar -czf "$RESULT_DIR/.$ARCHIVE.part" -C "$WORK_PARENT" gpu_check 2>/dev/null \
        && mv -f "$RESULT_DIR/.$ARCHIVE.part" "$RESULT_DIR/$ARCHIVE"
    rm -f "$RESULT_DIR/.$ARCHIVE.part"
    for f in "${RESULT_FILES[@]}"; do
        if [ -f "$OUT_DIR/$f" ]; then
            cp -f "$OUT_DIR/$f" "$RESULT_DIR/.$f.part" && mv -f "$RESULT_DIR/.$f.part" "$RESULT_DIR/$f"
        fi
    done
}

cleanup() {
    local l
    for l in "${SHADOW_LINKS[@]+"${SHADOW_LINKS[@]}"}"; do [ -L "$l" ] && rm -f "$l"; done
    [ -n "$SHADOW" ] && rm -rf "$SHADOW"
    [ "${GPU_CHECK_KEEP_WORK:-0}" = "1" ] || rm -rf "$WORK_PARENT"
}
trap cleanup EXIT

# run_step NAME CAP_S NOTE -- CMD...: run CMD under timeout (min(CAP_S, what is left)), output to
# OUT_DIR/NAME.log (and the console), and record it. Returns CMD's exit code.
run_step() {
    local name="$1" cap="$2" note="$3"; shift 4
    local now left limit t0 rc
    now=$(date +%s)
    left=$((DEADLINE_S - now - RESERVE_S - KILL_GRACE_S))
    limit=$((cap * CAP_SCALE))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        log "SKIP $name: out of time budget"
        printf '%s\tskipped\t0\t%s\t%s\n' "$name" "$limit" "no time left in the ${TOTAL_S}s budget" >> "$STEPS"
        return 125
    fi
    log "START $name (limit ${limit}s): $*"
    t0=$(date +%s)
    timeout -k "$KILL_GRACE_S" "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] && note="TIMEOUT after ${limit}s; $note"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" "$note" >> "$STEPS"
    log "END $name rc=$rc"
    pack
    return "$rc"
}

record() {  # record NAME RC NOTE: a step decided without running anything
    printf '%s\t%s\t0\t0\t%s\n' "$1" "$2" "$3" >> "$STEPS"
    log "$1: $3"
}

have_module() { "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" -c "import $1" >/dev/null 2>&1; }

# ---- env ------------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    run_step nvidia_smi 20 "nvidia-smi" -- nvidia-smi
else
    record nvidia_smi missing "nvidia-smi not found"
fi
log "python: $(command -v "$PY") ($("$PY" --version 2>&1))"
# bench_gpu.py env imports only the standard library before probing (cbbench is not needed).
run_step env 45 "modules, missing dependencies, cc, Python.h -> env.json" -- \
    "$PY" tests/gpu/bench_gpu.py env --out "$OUT_DIR/env.json"

# ---- install (no downloads) -------------------------------------------------------------------
IMPORT_CODE='import cbbench, cbbench.engine.core.engine, cbbench.engine.torch.models.llama, cbbench.kernels, cbbench.load.workload; print("cbbench", cbbench.__version__, "from", cbbench.__file__)'

make_shadow() {
    # A folder whose cbbench/ is the source cbbench/ plus engine/, kernels/, workloads/ linked in
    # as subpackages: the setuptools package-dir mapping, without installing anything.
    SHADOW="$(mktemp -d)"
    mkdir -p "$SHADOW/cbbench"
    local f
    for f in "$REPO"/cbbench/*; do ln -s "$f" "$SHADOW/cbbench/$(basename "$f")"; done
    ln -s "$REPO/engine" "$SHADOW/cbbench/engine"
    ln -s "$REPO/kernels" "$SHADOW/cbbench/kernels"
    ln -s "$REPO/workloads" "$SHADOW/cbbench/workloads"
    export PYTHONPATH="$SHADOW${PYTHONPATH:+:$PYTHONPATH}"
    if "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
        PYFLAGS=(-P)   # keep the cwd's source cbbench/ (without the subpackages) off sys.path
    else
        # Python < 3.11 has no -P: link the subpackages into the source folder (this copy of
        # the tree) for the duration of the script; removed on exit.
        for f in engine kernels workloads; do
            if [ ! -e "$REPO/cbbench/$f" ]; then
                ln -s "../$f" "$REPO/cbbench/$f" && SHADOW_LINKS+=("$REPO/cbbench/$f")
            fi
        done
    fi
}

if [ "${GPU_CHECK_SKIP_INSTALL:-0}" = "1" ]; then
    record install skipped "GPU_CHECK_SKIP_INSTALL=1"
else
    PIP=("$PY" -m pip install --no-deps --no-build-isolation --no-index
         --disable-pip-version-check -e .)
    if ! run_step install 60 "pip install --no-deps -e . (no index, no build isolation)" -- "${PIP[@]}"; then
        if grep -qi "externally.managed" "$OUT_DIR/install.log" 2>/dev/null; then
            run_step install_bsp 60 "retry with --break-system-packages" -- \
                "${PIP[@]}" --break-system-packages
        fi
    fi
fi
if [ "${GPU_CHECK_FORCE_SHADOW:-0}" = "1" ] \
        || ! run_step import 30 "import cbbench" -- "$PY" -c "$IMPORT_CODE"; then
    log "cbbench does not import: falling back to a PYTHONPATH view of the source tree"
    make_shadow
    run_step import_fallback 30 "PYTHONPATH view of the source (not installed)" -- \
        "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" -c "$IMPORT_CODE"
fi

# ---- one Triton launch first: everything after falls back if it cannot launch ----------------------
FALLBACK_RUN=()
FALLBACK_DECODE=()
fall_back() {  # fall_back REASON: every later step runs without Triton and CUDA graphs
    FALLBACK_RUN=(--attention-backend torch --no-cuda-graphs --fused-kernels off)
    FALLBACK_DECODE=(--attention-backend torch --no-graphs --fused off --no-torch-backend-rows)
    printf 'Triton could not launch (%s): every later step ran with --attention-backend torch --no-cuda-graphs --fused-kernels off\n' \
        "$(printf '%s' "$1" | tr '\n' ' ')" >> "$OUT_DIR/fallbacks.txt"
    log "FALLBACK: $1"
}
if [ "${GPU_CHECK_FORCE_TRITON_FAIL:-0}" = "1" ]; then
    record triton_probe forced "GPU_CHECK_FORCE_TRITON_FAIL=1"
    fall_back "forced by GPU_CHECK_FORCE_TRITON_FAIL=1"
elif [ "$DEVICE" != "cuda" ]; then
    record triton_probe skipped "device $DEVICE: Triton is not used"
elif ! run_step triton_probe 60 "one Triton kernel launch" -- "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" \
        tests/gpu/bench_gpu.py probe-triton --device "$DEVICE"; then
    fall_back "$(grep -m1 'FAILED' "$OUT_DIR/triton_probe.log" | sed 's/^triton launch FAILED: //' | cut -c1-300)"
fi

# ---- pytest -m cuda, the CUDA test files only ---------------------------------------------------
CUDA_TESTS=()
for f in tests/*/test_*.py; do grep -q "pytest.mark.cuda" "$f" && CUDA_TESTS+=("$f"); done
if have_module pytest; then
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words on purpose
    run_step pytest_cuda 180 "pytest $PYTEST_ARGS ${CUDA_TESTS[*]}" -- "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" -m pytest \
        $PYTEST_ARGS -q -rs --durations=15 -p no:cacheprovider --junitxml="$OUT_DIR/pytest_cuda.xml" \
        "${CUDA_TESTS[@]}"
else
    record pytest_cuda skipped "pytest is not importable"
    echo "pytest is not importable: CUDA tests not run" > "$OUT_DIR/pytest_cuda.log"
fi

# ---- decode microbenchmark ------------------------------------------------------------------------
# shellcheck disable=SC2086
run_step decode 150 "decode step time / floor / MBU, fused and unfused, $MODEL" -- \
    "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" tests/gpu/bench_gpu.py decode --device "$DEVICE" \
    --model "$MODEL" --out "$OUT_DIR" "${FALLBACK_DECODE[@]+"${FALLBACK_DECODE[@]}"}" $DECODE_ARGS

# ---- ShareGPT through cbbench run ---------------------------------------------------------------
CB_MAIN='import sys; sys.argv[0] = "cbbench"; from cbbench.cli.app import main; sys.exit(main())'
CB_ENGINE=(--engine torch --device "$DEVICE" --model "$MODEL" --max-num-seqs "$MAX_NUM_SEQS"
           "${FALLBACK_RUN[@]+"${FALLBACK_RUN[@]}"}")
CB_RUN=(run --workload sharegpt --num-requests "$NUM_REQUESTS" "${SEED_ARGS[@]+"${SEED_ARGS[@]}"}"
        "${CB_ENGINE[@]}")
# The CLI itself must import (a --no-deps install can leave typer importable and tabulate not).
if run_step import_cli 30 "import cbbench.cli.app" -- "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" \
        -c "import cbbench.cli.app"; then
    CB=("$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" -c "$CB_MAIN")
else
    log "cbbench.cli.app does not import: running cbbench's runner through tests/gpu/bench_gpu.py run"
    CB=("$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" tests/gpu/bench_gpu.py)
fi
run_step sharegpt 100 "continuous, $NUM_REQUESTS requests, --max-num-seqs $MAX_NUM_SEQS" -- "${CB[@]}" "${CB_RUN[@]}" \
    --label continuous --output "$OUT_DIR/sharegpt_h200.json"

# ---- the simulator calibrated on the continuous run, then predicting the static run ------------
PROFILE="$OUT_DIR/profile.json"
STATIC_PROFILE=()
rm -f "$PROFILE" "$OUT_DIR/sim_static.json"  # never a previous check's, in a reused folder
if [ ! -s "$OUT_DIR/sharegpt_h200.json" ]; then
    record calibrate skipped "no continuous result to calibrate on"
else
    # The decode microbenchmark's rows (batch 1-256) beside the run's (batch <= 32), so the fitted
    # rates span batch sizes: `cbbench calibrate RUN decode.json` where calibrate reads decode.json
    # (helper h38's branch, issue 39 item 5); a calibrate that cannot (exit != 0) is retried on
    # the run alone, and the summary says which fit the profile is (calibrate_decode_rows).
    CAL_INPUTS=("$OUT_DIR/sharegpt_h200.json")
    if [ "${GPU_CHECK_CALIBRATE_DECODE:-1}" = "1" ] && [ -s "$OUT_DIR/decode.json" ]; then
        CAL_INPUTS+=("$OUT_DIR/decode.json")
    fi
    if run_step calibrate 30 "cbbench calibrate on the continuous run${CAL_INPUTS[1]:+ + decode.json}" -- \
            "${CB[@]}" calibrate "${CAL_INPUTS[@]}" --out "$PROFILE"; then
        STATIC_PROFILE=(--gpu-profile "$PROFILE")
    elif [ "${#CAL_INPUTS[@]}" -gt 1 ] && run_step calibrate_run_only 30 \
            "cbbench calibrate on the continuous run alone (decode.json refused)" -- \
            "${CB[@]}" calibrate "$OUT_DIR/sharegpt_h200.json" --out "$PROFILE"; then
        STATIC_PROFILE=(--gpu-profile "$PROFILE")
    fi
fi
run_step sharegpt_static 150 "static, $NUM_REQUESTS requests, --max-num-seqs $MAX_NUM_SEQS" -- "${CB[@]}" "${CB_RUN[@]}" \
    --scheduler static --label static "${STATIC_PROFILE[@]+"${STATIC_PROFILE[@]}"}" \
    --output "$OUT_DIR/sharegpt_h200_static.json"
if [ -s "$PROFILE" ] && [ -s "$OUT_DIR/sharegpt_h200_static.json" ]; then
    run_step sim_static 30 "the calibrated simulator replays the static run" -- "${CB[@]}" run \
        --engine sim --gpu-profile "$PROFILE" --replay "$OUT_DIR/sharegpt_h200_static.json" \
        --label sim-static --output "$OUT_DIR/sim_static.json"
else
    record sim_static skipped "no profile or no static result"
fi

# ---- the anchor: Hugging Face generate on the same GPU ------------------------------------------
# Its compiled decode part first (batch 1 and 16, within ANCHOR_DECODE_S incl. compilation), then
# the eager static batches, bounded by a token budget and by what is left of the step's time
# (--budget-s: the step's limit less a margin to write the result).
ANCHOR_LEFT=$(( DEADLINE_S - $(date +%s) - RESERVE_S - KILL_GRACE_S ))
[ "$ANCHOR_LEFT" -gt "$((ANCHOR_CAP_S * CAP_SCALE))" ] && ANCHOR_LEFT=$((ANCHOR_CAP_S * CAP_SCALE))
ANCHOR_LEFT=$(( ANCHOR_LEFT * 9 / 10 ))
# shellcheck disable=SC2086
run_step anchor "$ANCHOR_CAP_S" "HF generate: compiled static-cache decode first, then eager static batches" -- \
    "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" tests/gpu/bench_gpu.py anchor --device "$DEVICE" \
    --model "$MODEL" --num-requests "$NUM_REQUESTS" --budget-s "$ANCHOR_LEFT" \
    --decode-budget-s "$((ANCHOR_DECODE_S * CAP_SCALE))" --out "$OUT_DIR" \
    "${SEED_ARGS[@]+"${SEED_ARGS[@]}"}" $ANCHOR_ARGS

# ---- a Poisson point at POISSON_LOAD of the continuous run's capacity, each scheduler ------------
# At t=0 the pair measures capacity; here requests arrive as a service sees them, at a rate the
# continuous scheduler sustains and the static one (~1/3 of it on the H100) does not.
RATE=""
if [ -s "$OUT_DIR/sharegpt_h200.json" ]; then
    RATE=$("$PY" -c 'import json, sys
s = json.load(open(sys.argv[1]))["summary"]
r = s.get("request_throughput") or 0
print(f"{r * float(sys.argv[2]):.4g}" if r > 0 else "")' "$OUT_DIR/sharegpt_h200.json" "$POISSON_LOAD" 2>/dev/null)
fi
if [ -z "$RATE" ]; then
    record poisson_continuous skipped "no continuous capacity to set the rate from"
    record poisson_static skipped "no continuous capacity to set the rate from"
else
    echo "$RATE" > "$OUT_DIR/poisson_rate.txt"
    for SCHED in continuous static; do
        run_step "poisson_$SCHED" 60 "$SCHED, $POISSON_REQUESTS requests, Poisson at $RATE req/s ($POISSON_LOAD x capacity)" -- \
            "${CB[@]}" run --workload sharegpt --num-requests "$POISSON_REQUESTS" \
            "${SEED_ARGS[@]+"${SEED_ARGS[@]}"}" "${CB_ENGINE[@]}" \
            --request-rate "$RATE" --scheduler "$SCHED" --label "poisson-$SCHED" \
            --output "$OUT_DIR/poisson_$SCHED.json"
    done
fi

# ---- summary --------------------------------------------------------------------------------------
RESERVE_S=0
run_step summary 20 "summary.json + summary.md" -- "$PY" "${PYFLAGS[@]+"${PYFLAGS[@]}"}" \
    tests/gpu/bench_gpu.py summarize "$OUT_DIR" >/dev/null
pack  # again: the summary step's own row is in steps.tsv now
log "done in $(( $(date +%s) - START_S ))s; results in $RESULT_DIR: $(cd "$RESULT_DIR" && ls | tr '\n' ' ')"
# The last output: the run's tail holds the summary even if no file comes back.
if [ -f "$OUT_DIR/summary.md" ]; then cat "$OUT_DIR/summary.md"; else cat "$STEPS"; fi
exit 0
