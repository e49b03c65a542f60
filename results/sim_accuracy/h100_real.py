"""The simulator against the first real H100 runs (issue 38): the built-in h100 roofline and
`cbbench calibrate` profiles, each predicting real runs it was or was not fitted on.

    python results/sim_accuracy/h100_real.py [DATA_DIR]    (from the repo root; ~3-5 min)

DATA_DIR (default ../shared/gpu/h100-2026-12-06) holds ms32_continuous.json.gz and
ms32_static.json.gz (400 ShareGPT requests at t=0, --max-num-seqs 32, continuous and static
schedulers; an H100 80GB HBM3, Llama-3-8B random bf16) and decode.json (the GPU check's decode
microbenchmark: batch 1/16/64/256 at a 512-token context). For every prediction: the real
value, the prediction, the error and the simulator's 90% interval (summary.intervals, from the
profile's residual spread; none for the built-in roofline, which has no residuals), with the
intervals' measured coverage. Writes h100_real.md and h100_real.json beside this script.

Run-level metrics of these decode-heavy runs are mostly decode steps and queueing, so each
calibrated profile is also scored per step class (decode, mixed, prefill) on both runs'
recorded iterations (cbbench.analysis.profile_error.step_errors: the profile's roofline on
each record's batch shape against its measured time), in sample and out.

A run is predicted by replaying it (`cbbench run --engine sim --replay`: the same requests,
arrivals, scheduler and --max-num-seqs). A decode row is predicted by the profile's roofline
for that batch and context, without the engine's per-request overhead (the microbenchmark
times ModelRunner.execute alone).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_DATA = ROOT / ".." / "shared" / "gpu" / "h100-2026-12-06"
METRICS = {"TTFT p50 (ms)": ("ttft_ms", "p50"), "TPOT p50 (ms)": ("tpot_ms", "p50"),
           "output tok/s": ("output_throughput", None)}
BUILTIN = "built-in h100 roofline"
BUILTIN_MODELS = ("The built-in h100 roofline (`--gpu h100`, no profile) is peak-based: 80% of "
                  "the spec's 3.35 TB/s, 60% of its 989 dense bf16 TFLOP/s, 300 µs per step, "
                  "attention at those rates, no overhead per request or per prefill "
                  "(engine/sim/cost_model.py, Efficiency).")


def cbbench(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "cbbench", *args], capture_output=True, text=True,
                       cwd=ROOT, check=False)
    if r.returncode != 0:
        raise SystemExit(f"cbbench {' '.join(args)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def _metric(summary: dict, key: str, sub: str | None):
    v = summary.get(key)
    return v if sub is None else v[sub]


def _interval(summary: dict, key: str, sub: str | None):
    iv = (summary.get("intervals") or {}).get(key)
    if iv is not None and sub is not None:
        iv = iv.get(sub)
    return (iv["low"], iv["high"]) if iv else None


def predict_run(work: Path, profile: Path | None, real: Path, label: str) -> dict:
    out = work / f"sim_{label}.json"
    gpu = ["--gpu-profile", str(profile)] if profile else ["--gpu", "h100"]
    cbbench("run", "--engine", "sim", *gpu, "--replay", str(real), "--quiet", "--output",
            str(out))
    r = json.loads(real.read_text())["summary"]
    p = json.loads(out.read_text())["summary"]
    rows = {}
    for name, (key, sub) in METRICS.items():
        a, b = _metric(r, key, sub), _metric(p, key, sub)
        iv = _interval(p, key, sub)
        rows[name] = {"real": a, "predicted": b, "error": (b - a) / a, "interval": iv,
                      "covered": None if iv is None else iv[0] <= a <= iv[1]}
    return rows


def predict_decode(profile: Path | None, decode: dict) -> dict:
    from cbbench.engine.model_config import MODEL_PRESETS
    from cbbench.engine.sim.cost_model import BatchShape, CostModel, DeviceRates
    from cbbench.engine.sim.device_profile import load_profile
    from cbbench.engine.sim.gpu_specs import get_gpu_spec

    if profile is None:
        rates = DeviceRates.from_spec(get_gpu_spec("h100"))
        spread = None
    else:
        p = load_profile(profile)
        rates, spread = p.rates, (p.spread or {}).get("decode")
    cost = CostModel(MODEL_PRESETS["llama-3-8b"], "bf16",
                     rates=dataclasses.replace(rates, row_overhead_s=0.0))
    rows = {}
    for r in decode["rows"]:
        if not (r["graphs"] and r["fused"] and r["role"] == "main"):
            continue
        b, keys = r["batch_size"], float(r["batch_size"] * (r["context"] + 1))
        t = cost.cost(BatchShape(b, b, keys, keys, b, 0, keys)).time_s * 1e3
        real = r["step_ms"]["p50"]
        iv = None if spread is None else (t * spread["low"], t * spread["high"])
        rows[f"decode step, batch {b} (ms)"] = {
            "real": real, "predicted": t, "error": (t - real) / real, "interval": iv,
            "covered": None if iv is None else iv[0] <= real <= iv[1]}
    return rows


def class_errors(profile: Path, run: Path) -> dict:
    """The profile's step error on the run's recorded iterations, per class (n, bias: the
    median signed error, p90 |error|)."""
    from cbbench.analysis.profile_error import step_errors
    from cbbench.engine.sim.device_profile import load_profile

    return step_errors(load_profile(profile), json.loads(run.read_text()), str(run))


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DATA
    work = Path(tempfile.mkdtemp(prefix="h100_real_"))
    runs = {}
    for name in ("continuous", "static"):
        runs[name] = work / f"ms32_{name}.json"
        with gzip.open(data / f"ms32_{name}.json.gz", "rb") as src, open(runs[name], "wb") as dst:
            shutil.copyfileobj(src, dst)
    decode_path = data / "decode.json"
    decode = json.loads(decode_path.read_text())
    profiles = {
        "calibrate on ms32 continuous": [runs["continuous"]],
        "calibrate on ms32 static": [runs["static"]],
        "calibrate on ms32 continuous + decode.json": [runs["continuous"], decode_path],
    }
    paths: dict[str, Path | None] = {BUILTIN: None}
    fits = {}
    for k, (label, inputs) in enumerate(profiles.items()):
        path = work / f"profile{k}.json"
        cbbench("calibrate", *map(str, inputs), "--out", str(path))
        paths[label] = path
        fits[label] = json.loads(path.read_text())
    table = []
    for label, path in paths.items():
        for target in ("continuous", "static"):
            table.append({"predicting": f"ms32 {target}", "with": label,
                          "metrics": predict_run(work, path, runs[target],
                                                 f"{abs(hash(label))}_{target}")})
        table.append({"predicting": "decode.json (graphs, fused)", "with": label,
                      "metrics": predict_decode(path, decode)})
    steps = [{"predicting": f"ms32 {target}", "with": label,
              "classes": class_errors(path, runs[target])}
             for label, path in paths.items() if path is not None
             for target in ("continuous", "static")]
    covered = [m["covered"] for row in table for m in row["metrics"].values()
               if m["covered"] is not None]
    result = {
        "data": "H100 80GB HBM3, Llama-3-8B random bf16: ms32_continuous / ms32_static (400 "
                "ShareGPT requests at t=0, --max-num-seqs 32) and decode.json",
        "command": "python results/sim_accuracy/h100_real.py ../shared/gpu/h100-2026-12-06",
        "predictions": table,
        "step_errors": steps,
        "interval_coverage": {"level": 0.9, "covered": sum(covered), "of": len(covered)},
        "fits": {label: {k: {"used": p["used"], "status": p["status"],
                             "confounded_with": (p.get("confounded_with") or {}).get("param")}
                         for k, p in fit["params"].items()}
                 for label, fit in fits.items()},
        "fit_warnings": {label: fit.get("warnings", []) for label, fit in fits.items()},
    }
    (HERE / "h100_real.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "h100_real.md").write_text(markdown(result))
    shutil.rmtree(work)
    print((HERE / "h100_real.md").read_text())


def _fmt(v: float) -> str:
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}"


def markdown(result: dict) -> str:
    lines = [
        "# The simulator against the first real H100 runs (issue 38)",
        "",
        f"Data: {result['data']}. Command (from the repo root): `{result['command']}`.",
        "",
        "Runs are predicted by replaying them through the simulator (same requests, arrivals, "
        "scheduler, --max-num-seqs); decode rows by the profile's roofline at that batch and "
        "context. A profile's 90% interval comes from its residual spread (the built-in "
        "roofline has none). In-sample rows (a profile predicting the run it was fitted on) "
        "are marked *.",
        "",
        BUILTIN_MODELS,
        "",
        "| predicting | with | metric | real | predicted | error | 90% interval | covered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["predictions"]:
        fitted_on = row["with"].removeprefix("calibrate on ")
        star = "*" if row["predicting"].split(" (")[0] in fitted_on else ""
        for name, m in row["metrics"].items():
            iv = "-" if m["interval"] is None else f"{_fmt(m['interval'][0])}-{_fmt(m['interval'][1])}"
            cov = "-" if m["covered"] is None else ("yes" if m["covered"] else "no")
            lines.append(f"| {row['predicting']}{star} | {row['with']} | {name} | "
                         f"{_fmt(m['real'])} | {_fmt(m['predicted'])} | {m['error']:+.1%} | "
                         f"{iv} | {cov} |")
    c = result["interval_coverage"]
    lines += ["", f"90% intervals covered the real value in {c['covered']} of {c['of']} "
              "predictions (calibrated profiles only).", "",
              "## Step error per class", "",
              "Each calibrated profile on each run's recorded steps: the relative error of the "
              "predicted step time, per class (bias: the median signed error, > 0 too slow; "
              "p90 of |error|). In-sample rows are marked *.", "",
              "| predicting | with | decode: n, bias, p90 | mixed: n, bias, p90 | "
              "prefill: n, bias, p90 |", "|---|---|---|---|---|"]
    for row in result["step_errors"]:
        star = "*" if row["predicting"] in row["with"] else ""
        cells = ["-" if not c["n"] else f"{c['n']:,}, {c['bias']:+.1%}, {c['p90']:.1%}"
                 for c in row["classes"].values()]
        lines.append(f"| {row['predicting']}{star} | {row['with']} | " + " | ".join(cells) + " |")
    lines += ["", "## The fits", ""]
    for label, params in result["fits"].items():
        lines.append(f"**{label}**: " + "; ".join(
            f"{k} {p['used']:.4g} ({p['status']}"
            + (f", with {p['confounded_with']}" if p["confounded_with"] else "") + ")"
            for k, p in params.items()))
        for w in result["fit_warnings"][label]:
            lines.append(f"  - warning: {w}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
