"""The calibration offline, without timing noise: refit each repeat's recorded calibration run
and predict recorded real target runs through the simulator (--replay).

    python results/sim_accuracy/offline.py DIR [DIR ...] > results/sim_accuracy/offline.md

Each DIR holds a repeat's full results from run.sh (cal.json, real.json). For every pair
(calibrated on I, predicting J) it runs `cbbench calibrate I/cal.json` and `cbbench run
--engine sim --gpu-profile ... --replay J/real.json`, and prints the errors of TTFT p50, TPOT
p50 and output throughput against J's real run: the diagonal (I = J) is what run.sh reports,
the rest shows how much the profile depends on which calibration run it came from. Last, a
diagnostic outside the simulator: each run's decode steps fitted alone by a plain robust line,
time = t0 + tr x rows + tk x MB of KV read, for the calibration and the target run; tk is what
a long-context decode step mostly costs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from summarize import TARGET, get  # this folder's: the errors are read as run.sh reads them

METRICS = (("TTFT p50", ("ttft_ms", "p50")), ("TPOT p50", ("tpot_ms", "p50")),
           ("throughput", ("output_throughput",)))


def decode_line(result: dict) -> tuple[float, float, float]:
    """(t0 µs, tr µs per row, tk µs per MB of KV read) of the decode steps, by a soft-L1 fit
    of log time (robust to a busy host's stretched steps)."""
    from scipy.optimize import least_squares

    from cbbench.analysis.calibration import fit_data

    data = fit_data([("run", result)])[0]
    dec = np.array([label == "decode" for label in data.labels])
    x = np.stack([np.ones(dec.sum()), data.num_reqs[dec], data.attn[dec, 1] / 1e6], axis=1)
    t = data.measured[dec]
    start = np.clip(np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)[0], 1e-9, None)
    fit = least_squares(lambda c: np.log(np.maximum(x @ c, 1e-12) / t), start,
                        bounds=(0, np.inf), loss="soft_l1", f_scale=0.05, x_scale="jac")
    return tuple(float(c) * 1e6 for c in fit.x)


def cbbench(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "cbbench", *args], check=True, stdout=subprocess.DEVNULL)


def main(dirs: list[Path]) -> None:
    tmp = Path(tempfile.mkdtemp())
    names = [d.name for d in dirs]
    reals = {d.name: json.loads((d / "real.json").read_text()) for d in dirs}
    errors: dict[tuple[str, str], list[float]] = {}
    rates = {}
    for d in dirs:
        profile = tmp / f"{d.name}.json"
        cbbench("calibrate", str(d / "cal.json"), "--out", str(profile))
        rates[d.name] = json.loads(profile.read_text())
        for t in dirs:
            pred = tmp / f"{d.name}-{t.name}.json"
            cbbench("run", "--engine", "sim", "--gpu-profile", str(profile), "--replay",
                    str(t / "real.json"), "--summary-only", "--output", str(pred))
            p = json.loads(pred.read_text())
            real = reals[t.name]
            errors[d.name, t.name] = [get(p, m) / get(real, m) - 1 for _, m in METRICS]
    print("## Calibrated on I, predicting I (what run.sh reports)\n")
    print("| repeat | " + " | ".join(n for n, _ in METRICS)
          + " | worst | row overhead (rse) | fitted parameters |")
    print("|---|" + "---|" * (len(METRICS) + 3))
    for n in names:
        e = errors[n, n]
        fitted = ", ".join(f"{k}" for k, v in rates[n]["params"].items()
                           if v["status"] == "fitted" and k != "host_factor")
        cells = " | ".join(f"{x:+.1%}" for x in e)
        row = rates[n]["params"]["row_overhead_s"]
        row_text = (f"{row['used'] * 1e6:.0f} µs ({row['rse']:.0%})" if row["rse"] is not None
                    else row["status"])
        print(f"| {n} | {cells} | {max(map(abs, e)):.1%} | {row_text} | {fitted} |")
    print("\n## Every pair (calibrated on I, predicting J): largest of the three |errors|\n")
    print("| I \\ J | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i in names:
        print(f"| {i} | " + " | ".join(f"{max(map(abs, errors[i, j])):.1%}" for j in names)
              + " |")
    worst = [max(map(abs, e)) for e in errors.values()]
    within = sum(w <= TARGET for w in worst)
    print(f"\n{within} of {len(worst)} pairs within {TARGET:.0%} on all three; median worst "
          f"{statistics.median(worst):.1%}, max {max(worst):.1%}. Per metric, median |error| "
          "over the pairs: " + ", ".join(
              f"{n} {statistics.median(abs(e[k]) for e in errors.values()):.1%}"
              for k, (n, _) in enumerate(METRICS)))
    print("\n## Decode steps alone, a plain line: t0 + tr x rows + tk x MB of KV read\n")
    print("| repeat | calibration t0 / tr / tk | target t0 / tr / tk |")
    print("|---|---|---|")
    for d in dirs:
        cal = decode_line(json.loads((d / "cal.json").read_text()))
        tgt = decode_line(reals[d.name])
        print(f"| {d.name} | " + " | ".join(" / ".join(f"{v:.0f}" for v in c)
                                           for c in (cal, tgt)) + " |")


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]])
