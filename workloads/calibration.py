"""The ``calibration`` workload: one short run that shows `cbbench calibrate` every term of the
simulator's roofline (issue 38).

A ShareGPT run at --max-num-seqs 32 decodes at batch ~22 and contexts of a few hundred
tokens: every step reads the weights once, so bandwidth and a fixed overhead cannot be told
apart, and nothing shows a large batch or a long context. This workload sends waves of
1, 2, 4, ... WAVE_MAX requests, WAVE_GAP_S apart (with ``--arrival trace``), so the running
batch climbs from 1 to the largest wave (or --max-num-seqs) and drains back down as the
outputs (of four lengths) finish: decode steps at every batch size on the way. Prompts cycle
through PROMPT_LENS (128 to ~8k tokens), so decode rows read contexts of 128 to 8k keys and
chunked prefill cuts chunks of many sizes; the later waves arrive while the earlier decode,
which gives mixed steps.

Run it, then calibrate on it (docs/simulator.md, "Calibrating on a GPU"):

    cbbench run --workload calibration --arrival trace --engine torch --device cuda \
        --model llama-3-8b --max-num-seqs 128 --output calibration.json
    cbbench calibrate calibration.json --out profile.json
"""

from __future__ import annotations

# Prompt lengths: 128 to 8k contexts (7,936 + the longest output stays within an 8,192-token
# model length). Each wave cycles through them, so every wave holds short and long prompts.
PROMPT_LENS = (128, 256, 512, 1024, 2048, 4096, 7936)
# Output lengths: four, so the batch drains in steps rather than all at once.
OUTPUT_LENS = (32, 64, 128, 256)
WAVE_MAX = 128  # the largest wave: the batch reaches min(this + what is still running, max)
WAVE_GAP_S = 1.5  # a wave of one request decodes its 256 tokens alone in ~1.5 s on an H100
DESCRIPTION = (
    "waves of 1, 2, 4, ... 128 requests 1.5 s apart (with --arrival trace), "
    "prompts of 128-7,936 tokens, outputs of 32-256: decode at every batch size and at "
    "contexts of 128-8k, prefill chunks of many sizes, mixed steps"
)


def calibration_rows() -> list[tuple[int, int, float]]:
    """(prompt_len, output_len, arrival_s) of every request, in arrival order."""
    rows: list[tuple[int, int, float]] = []
    wave, size = 0, 1
    while size <= WAVE_MAX:
        for _ in range(size):
            k = len(rows)
            rows.append((PROMPT_LENS[k % len(PROMPT_LENS)],
                         OUTPUT_LENS[(k // len(PROMPT_LENS)) % len(OUTPUT_LENS)],
                         wave * WAVE_GAP_S))
        wave, size = wave + 1, size * 2
    return rows
