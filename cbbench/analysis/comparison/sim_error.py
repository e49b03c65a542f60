"""How far the simulator's roofline was off, per iteration class.

One definition for two uses: ``summary.engine.sim_error`` on every real run (the engine's
``predicted_s`` against the measured ``duration_s``) and the fit residuals ``cbbench calibrate``
writes into a device profile. The error of an iteration is |predicted - measured| / measured;
classes: ``decode`` (decode rows only), ``mixed`` (prefill and decode rows), ``prefill``
(prefill rows only). Steps that run no tokens (swap copies only) belong to no class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CLASSES = ("decode", "mixed", "prefill")
NO_PREDICTION_REASON = (
    "no prediction for this device: the CPU has no spec; calibrate one with "
    "`cbbench calibrate RESULT.json --out PROFILE.json` and run with --gpu-profile PROFILE.json"
)
SIMULATED_REASON = "simulated run: the prediction is the measurement"
INTERRUPTED_NOTE = "no iteration with a prediction and a measured time"


def iteration_class(num_prefill_tokens: int, num_decode_tokens: int) -> str | None:
    if num_prefill_tokens and num_decode_tokens:
        return "mixed"
    if num_decode_tokens:
        return "decode"
    if num_prefill_tokens:
        return "prefill"
    return None


def class_labels(iterations: Sequence[dict]) -> list[str | None]:
    return [iteration_class(it["num_prefill_tokens"], it["num_decode_tokens"]) for it in iterations]


def error_stats(predicted: np.ndarray, measured: np.ndarray, labels: Sequence[str | None]) -> dict:
    """{"decode": {"median", "p90", "n", "bias"}, "mixed": ..., "prefill": ...} of the relative
    errors; ``bias`` is the median signed error (> 0: the prediction is too slow)."""
    signed = (predicted - measured) / measured
    classes = np.asarray(labels, dtype=object)
    out: dict[str, dict[str, float | int | None]] = {}
    for cls in CLASSES:
        e = signed[classes == cls]
        if e.size == 0:
            out[cls] = {"median": None, "p90": None, "n": 0, "bias": None}
            continue
        a = np.abs(e)
        out[cls] = {
            "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90)),
            "n": int(e.size),
            "bias": float(np.median(e)),
        }
    return out


def sim_error(iterations: Sequence[dict], simulated: bool) -> tuple[dict | None, str | None]:
    """(``summary.engine.sim_error``, the reason it is None). A simulated run's error is None:
    its durations are its predictions."""
    if simulated:
        return None, SIMULATED_REASON
    rows = [
        it
        for it in iterations
        if it.get("predicted_s") is not None
        and it["duration_s"] > 0
        and iteration_class(it["num_prefill_tokens"], it["num_decode_tokens"]) is not None
    ]
    if not rows:
        has_prediction = any(it.get("predicted_s") is not None for it in iterations)
        return None, INTERRUPTED_NOTE if has_prediction else NO_PREDICTION_REASON
    predicted = np.array([it["predicted_s"] for it in rows], dtype=np.float64)
    measured = np.array([it["duration_s"] for it in rows], dtype=np.float64)
    return error_stats(predicted, measured, class_labels(rows)), None
