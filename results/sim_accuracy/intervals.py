"""Coverage of summary.intervals on the recorded CPU repeats: does the real run's figure fall
inside the interval the simulator gives with a profile?

    python results/sim_accuracy/intervals.py > results/sim_accuracy/intervals.md

For every repeat rN here (its profile.json, and its real target run's figures in the
`real-long-prompt` column of compare.txt), the target workload is simulated with rN's profile
(`cbbench run --engine sim --gpu-profile rN/profile.json --workload long-prompt
--num-requests 60 --seed 1 --max-num-seqs 8 --max-model-len 8192`, run.sh's prediction
step), which reports summary.intervals (the profiles predate the `spread` field, so it is
derived from their `residuals`, as for any such profile). Each interval is checked against
the same repeat's real figures (what a user of that profile would see) and against every
other repeat's (calibrated on one run, predicting another). Quiet-host repeats (r9-r18) and
loaded-host repeats (r3-r8) are counted apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
FIGURES = (("TTFT p50", "TTFT p50 (ms)", ("ttft_ms", "p50")),
           ("TTFT p99", "TTFT p99 (ms)", ("ttft_ms", "p99")),
           ("TPOT p50", "TPOT p50 (ms)", ("tpot_ms", "p50")),
           ("TPOT p99", "TPOT p99 (ms)", ("tpot_ms", "p99")),
           ("throughput", "output throughput (tok/s)", ("output_throughput",)))
QUIET = {f"r{i}" for i in range(9, 19)}
COMMAND = ["--engine", "sim", "--workload", "long-prompt", "--num-requests", "60", "--seed", "1",
           "--max-num-seqs", "8", "--max-model-len", "8192", "--summary-only", "--json"]


def real_figures(compare: Path) -> dict[str, float]:
    out = {}
    for line in compare.read_text().splitlines():
        for name, row, _ in FIGURES:
            if line.startswith(row):
                out[name] = float(re.split(r"\s{2,}", line)[1].replace(",", ""))
    return out


def band(intervals: dict, path: tuple) -> dict:
    v = intervals
    for k in path:
        v = v[k]
    return v


def main() -> None:
    repeats = sorted((d for d in HERE.glob("r*") if (d / "profile.json").is_file()
                      and (d / "compare.txt").is_file()), key=lambda d: int(d.name[1:]))
    reals = {d.name: real_figures(d / "compare.txt") for d in repeats}
    bands = {}
    with tempfile.TemporaryDirectory() as tmp:
        for d in repeats:
            out = Path(tmp) / "sim.json"
            subprocess.run([sys.executable, "-m", "cbbench", "run", *COMMAND, "--gpu-profile",
                            str(d / "profile.json"), "--output", str(out)], check=True,
                           stdout=subprocess.DEVNULL)
            s = json.loads(out.read_text())["summary"]
            bands[d.name] = {name: band(s["intervals"], path) for name, _, path in FIGURES}
    load = os.getloadavg()
    print("# summary.intervals against the recorded CPU repeats\n")
    print("Made by `python results/sim_accuracy/intervals.py > results/sim_accuracy/"
          f"intervals.md` (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; the "
          "simulator's figures do not depend on it). Each simulation: `cbbench run "
          + " ".join(COMMAND) + " --gpu-profile rN/profile.json`. Nominal level 0.9.\n")
    print("## Each repeat's interval against its own real run\n")
    print("| repeat | " + " | ".join(n for n, _, _ in FIGURES) + " |")
    print("|---|" + "---|" * len(FIGURES))
    for d in repeats:
        cells = []
        for name, _, _ in FIGURES:
            b, real = bands[d.name][name], reals[d.name][name]
            inside = b["low"] <= real <= b["high"]
            cells.append(f"{real:,.1f} in [{b['low']:,.1f}, {b['high']:,.1f}]"
                         + ("" if inside else " **out**"))
        print(f"| {d.name} | " + " | ".join(cells) + " |")

    def coverage(pairs) -> tuple[int, int]:
        hits = total = 0
        for i, j in pairs:
            for name, _, _ in FIGURES:
                b = bands[i][name]
                hits += b["low"] <= reals[j][name] <= b["high"]
                total += 1
        return hits, total

    names = [d.name for d in repeats]
    print("\n## Coverage (figure-checks inside the interval / all)\n")
    print("| set | own run | every pair (profile I, real run J) |")
    print("|---|---|---|")
    for label, group in (("quiet host r9-r18", [n for n in names if n in QUIET]),
                         ("loaded host r3-r8", [n for n in names if n not in QUIET]),
                         ("all", names)):
        own = coverage([(n, n) for n in group])
        every = coverage([(i, j) for i in group for j in group])
        print(f"| {label} | {own[0]}/{own[1]} = {own[0] / own[1]:.0%} | "
              f"{every[0]}/{every[1]} = {every[0] / every[1]:.0%} |")
    print("\n## Per figure, quiet host, every pair\n")
    quiet = [n for n in names if n in QUIET]
    print("| figure | inside | mean width (high / low - 1) |")
    print("|---|---|---|")
    for name, _, _ in FIGURES:
        inside = sum(bands[i][name]["low"] <= reals[j][name] <= bands[i][name]["high"]
                     for i in quiet for j in quiet)
        width = sum(bands[i][name]["high"] / bands[i][name]["low"] - 1 for i in quiet)
        print(f"| {name} | {inside}/{len(quiet) ** 2} | {width / len(quiet):.0%} |")


if __name__ == "__main__":
    main()
