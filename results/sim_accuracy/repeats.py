"""The simulator's error over repeats of run.sh, beside the real runs' own repeat-to-repeat
spread (the noise floor of any prediction on this host).

    python results/sim_accuracy/repeats.py WORK_DIR [WORK_DIR ...] > repeats.md

Each WORK_DIR is one run.sh repeat's $WORK (cal.json, real.json, sim.json). "real vs real":
each repeat's real target run "predicting" the next repeat's, taken as the prediction.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

METRICS = (("TTFT p50", ("ttft_ms", "p50")), ("TPOT p50", ("tpot_ms", "p50")),
           ("output throughput", ("output_throughput",)))


def get(result: dict, path: tuple[str, ...]) -> float:
    node = result["summary"]
    for key in path:
        node = node[key]
    return float(node)


def load(d: str, name: str) -> dict:
    return json.loads((Path(d) / name).read_text())


def main(dirs: list[str]) -> None:
    reals = [load(d, "real.json") for d in dirs]
    sims = [load(d, "sim.json") for d in dirs]
    cals = [load(d, "cal.json") for d in dirs]
    print("Made by `python results/sim_accuracy/repeats.py WORK_r3 ... WORK_r8 > results/sim_accuracy/repeats.md` (each WORK_rN: the folder run.sh wrote that repeat's full results to)." + "\n")
    print("| repeat | calibration run | " + " | ".join(
        f"{m} real / sim (error)" for m, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    errors = {m: [] for m, _ in METRICS}
    for d, cal, real, sim in zip(dirs, cals, reals, sims):
        rate = cal["config"]["request_rate"]
        cells = []
        for m, path in METRICS:
            r, s = get(real, path), get(sim, path)
            errors[m].append((s - r) / r)
            cells.append(f"{r:,.1f} / {s:,.1f} ({(s - r) / r:+.0%})")
        print(f"| {Path(d).name} | rate {rate}, {cal['summary']['duration_s']:.0f} s | "
              + " | ".join(cells) + " |")
    print()
    print("| | " + " | ".join(m for m, _ in METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    sim_row = [statistics.median(abs(e) for e in errors[m]) for m, _ in METRICS]
    print("| simulator: median abs error over repeats | "
          + " | ".join(f"{v:.0%}" for v in sim_row) + " |")
    rvr = []
    for _, path in METRICS:
        pairs = [(get(a, path), get(b, path)) for a, b in zip(reals, reals[1:])]
        rvr.append(statistics.median(abs(b - a) / b for a, b in pairs))
    print("| real vs real (next repeat): median abs difference | "
          + " | ".join(f"{v:.0%}" for v in rvr) + " |")
    spread = []
    for _, path in METRICS:
        v = [get(r, path) for r in reals]
        spread.append(statistics.stdev(v) / statistics.mean(v))
    print("| real target runs: coefficient of variation | "
          + " | ".join(f"{v:.0%}" for v in spread) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
