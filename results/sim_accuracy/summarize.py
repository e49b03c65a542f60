"""Errors of the simulator's prediction against a real run (results/sim_accuracy/run.sh).

    python results/sim_accuracy/summarize.py CAL.json REAL.json SIM.json [REPLAY.json]

Prints a Markdown table: TTFT p50, TPOT p50 and output throughput of the real run and of
each prediction, with the relative error, and the real runs' own summary.engine.sim_error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

METRICS = (("TTFT p50 (ms)", ("ttft_ms", "p50")), ("TPOT p50 (ms)", ("tpot_ms", "p50")),
           ("output throughput (tok/s)", ("output_throughput",)))
TARGET = 0.15


def get(result: dict, path: tuple[str, ...]) -> float:
    node = result["summary"]
    for key in path:
        node = node[key]
    return float(node)


def main(paths: list[str]) -> None:
    cal, real, *preds = (json.loads(Path(p).read_text()) for p in paths)
    print("| metric | real | " + " | ".join(p["config"]["label"] for p in preds) + " |")
    print("|---|---|" + "---|" * len(preds))
    worst = 0.0
    for name, path in METRICS:
        r = get(real, path)
        cells = []
        for p in preds:
            v = get(p, path)
            err = (v - r) / r
            worst = max(worst, abs(err))
            cells.append(f"{v:,.2f} ({err:+.1%})")
        print(f"| {name} | {r:,.2f} | " + " | ".join(cells) + " |")
    verdict = "within" if worst <= TARGET else "NOT within"
    print(f"\nlargest error {worst:.1%}: {verdict} {TARGET:.0%}\n")
    for label, res in (("calibration run (no profile)", cal), ("target run (profile)", real)):
        eng = res["summary"]["engine"]
        err = eng.get("sim_error")
        if err is None:
            print(f"- {label}: sim_error null ({eng.get('sim_error_reason')})")
            continue
        parts = [
            f"{c} median {v['median']:.1%} p90 {v['p90']:.1%} bias {v['bias']:+.1%} (n={v['n']})"
            for c, v in err.items() if v["n"]
        ]
        print(f"- {label}: sim_error " + "; ".join(parts))


if __name__ == "__main__":
    main(sys.argv[1:])
