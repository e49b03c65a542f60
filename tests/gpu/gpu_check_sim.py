"""``sim_accuracy`` for the GPU check's summary: the simulator calibrated on the check's
continuous ShareGPT run (``cbbench calibrate`` -> profile.json), asked to predict its static
run (``cbbench run --engine sim --gpu-profile profile.json --replay`` the static run: the same
requests, arrival times and scheduling), against what the static run measured (issue 14).

For each headline metric: the real value, the prediction and the relative error
(predicted - real) / real. ``None`` with the reason when a step it needs did not produce its
file (a failed calibration's own one-line error is the reason)."""

from __future__ import annotations

import json
import math
from pathlib import Path

CALIBRATED_ON = "sharegpt_h200.json"  # the continuous run
PROFILE = "profile.json"
REAL = "sharegpt_h200_static.json"
PREDICTED = "sim_static.json"
CALIBRATE_LOG = "calibrate.log"  # gpu_check.sh's log of the calibrate step
# metric -> where it sits in a result's summary
METRICS = {
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "output_throughput": ("output_throughput", None),
}


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except Exception:  # noqa: BLE001 - a missing or broken file is "no data"
        return None


def _metric(summary: dict, key: str, sub: str | None) -> float | None:
    v = summary.get(key)
    if sub is not None:
        v = v.get(sub) if isinstance(v, dict) else None
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def compare(real: dict, predicted: dict) -> dict:
    """{metric: {"real", "predicted", "rel_error"}} of two result summaries."""
    out = {}
    for name, (key, sub) in METRICS.items():
        r, p = _metric(real, key, sub), _metric(predicted, key, sub)
        err = (p - r) / r if r and p is not None else None
        out[name] = {"real": r, "predicted": p, "rel_error": err}
    return out


def _calibrate_error(folder: Path) -> str:
    log = folder / CALIBRATE_LOG
    if log.is_file():
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()]
        if errors or lines:
            return f"calibrate failed: {(errors or lines)[-1][:300]}"
    return "calibrate did not run"


def sim_accuracy(folder: Path) -> tuple[dict | None, str | None]:
    """(the field, None) or (None, why not)."""
    if _load(folder / CALIBRATED_ON) is None:
        return None, f"no continuous ShareGPT result ({CALIBRATED_ON}) to calibrate on"
    profile = _load(folder / PROFILE)
    if not isinstance(profile, dict):
        return None, _calibrate_error(folder)
    real = _load(folder / REAL)
    if not isinstance(real, dict) or "summary" not in real:
        return None, f"no static run result ({REAL}) to predict"
    if real.get("interrupted"):
        return None, "the static run was interrupted: its request set is incomplete"
    predicted = _load(folder / PREDICTED)
    if not isinstance(predicted, dict) or "summary" not in predicted:
        return None, f"the simulator's replay of the static run ({PREDICTED}) did not finish"
    rs, ps = real["summary"], predicted["summary"]
    return {
        "calibrated_on": CALIBRATED_ON,
        "profile": PROFILE,
        "device": profile.get("device"),
        "device_name": profile.get("device_name"),
        "profile_iterations": profile.get("num_iterations"),
        "fitted": {k: p.get("used") for k, p in (profile.get("params") or {}).items()},
        "fit_residuals": profile.get("residuals"),
        "real": REAL,
        "predicted": PREDICTED,
        "completed": {"real": rs.get("completed"), "predicted": ps.get("completed")},
        "metrics": compare(rs, ps),
        # The calibrated profile's per-iteration error on the static run (it ran with it).
        "static_run_sim_error": (rs.get("engine") or {}).get("sim_error"),
    }, None


def markdown_line(field: dict | None, why_not: str | None) -> str:
    if field is None:
        return f"Simulator calibrated on the continuous run, predicting the static run: {why_not}"
    parts = []
    for name, m in field["metrics"].items():
        if m["rel_error"] is None:
            parts.append(f"{name} -")
        else:
            parts.append(f"{name} {m['real']:.4g} real / {m['predicted']:.4g} predicted "
                         f"({m['rel_error']:+.1%})")  # fmt: skip
    return (
        f"Simulator calibrated on the continuous run ({field['device']}, "
        f"{field['profile_iterations']} iterations), predicting the static run: "
        + "; ".join(parts)
    )
