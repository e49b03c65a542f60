"""One table of every sim-accuracy repeat, from the folders run.sh writes (summary.md and
uptime.txt in each).

    python results/sim_accuracy/table.py DIR [DIR ...] > results/sim_accuracy/table.md

A row per repeat: when it ran and the host's 1-minute load, the real target run's TTFT p50,
TPOT p50 and output throughput against the simulator's prediction (the sim-long-prompt column
of summary.md) with the relative error, and whether every error is within TARGET (15%).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from summarize import TARGET  # this folder's: the same 15% run.sh judges by

ROWS = ("TTFT p50 (ms)", "TPOT p50 (ms)", "output throughput (tok/s)")
ERROR = re.compile(r"([-\d.,]+) \(([-+][\d.]+)%\)")


def repeat_row(folder: Path) -> str:
    cells = {}
    for line in (folder / "summary.md").read_text().splitlines():
        parts = [p.strip() for p in line.strip("|").split("|")]
        if parts and parts[0] in ROWS:
            sim, err = ERROR.match(parts[2]).groups()
            cells[parts[0]] = (parts[1], sim, float(err))
    uptime = (folder / "uptime.txt").read_text().splitlines()
    when = uptime[0].split()[3]
    loads = [float(line.split("load average:")[1].split(",")[0]) for line in uptime]
    worst = max(abs(c[2]) for c in cells.values())
    figures = [f"{real} / {sim} ({err:+.1f}%)" for real, sim, err in (cells[r] for r in ROWS)]
    verdict = "yes" if worst <= TARGET * 100 else "no"
    return (f"| {folder.name} | {when} | {min(loads):.1f}-{max(loads):.1f} | "
            + " | ".join(figures) + f" | {worst:.1f}% | {verdict} |")


def main(folders: list[str]) -> None:
    print("Made by `python results/sim_accuracy/table.py DIR ... > results/sim_accuracy/table.md`"
          " (each DIR: the folder `run.sh` wrote that repeat's summary to).\n")
    print("| repeat | start (UTC) | 1-min load | TTFT p50 real / sim (ms) | TPOT p50 real / sim "
          "(ms) | output throughput real / sim (tok/s) | largest error | within 15% |")
    print("|---|---|---|---|---|---|---|---|")
    for f in sorted(folders, key=lambda p: int(re.sub(r"\D", "", Path(p).name) or 0)):
        print(repeat_row(Path(f)))


if __name__ == "__main__":
    main(sys.argv[1:])
