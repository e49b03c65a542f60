"""The simulator at scale: wall time and peak RSS of whole `cbbench run` processes, with and
without fast-forward, at growing request counts (issue 28's scale target: 1M ShareGPT
requests, llama-3-8b on the simulated H200, Poisson 400 req/s over 8 replicas, in <= 60 s
and <= 2 GB).

    python tests/bench/bench_sim_scale.py --sizes 10000,100000 --out results/sim_scale.md

Each run is a separate process (`/usr/bin/time -f '%e %M'` gives its wall time and peak RSS,
the whole process); both modes run back to back at each size, so their ratio is measured
under the same host load (recorded with `uptime` beside it). --summary-only, as the issue's
baseline (100k at 50 req/s, one replica: 38 s and 1.25 GB on a quiet host).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

CASES = {
    "dp8-400": ["--request-rate", "400", "--data-parallel-size", "8"],
    "dp1-50": ["--request-rate", "50"],
}


def one(n: int, case: str, ff: bool, tmp: Path) -> tuple[float, float, dict]:
    out = tmp / "r.json"
    cmd = ["cbbench", "run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b",
           "--workload", "sharegpt", "--num-requests", str(n), *CASES[case],
           "--fast-forward" if ff else "--no-fast-forward", "--summary-only", "--json",
           "--output", str(out)]
    timing = tmp / "time.txt"
    subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(timing), *cmd], check=True,
                   stdout=subprocess.DEVNULL)
    wall, kb = timing.read_text().split()[-2:]
    return float(wall), float(kb) * 1024, json.loads(out.read_text())["summary"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--cases", default="dp8-400,dp1-50")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases.split(","):
            for n in map(int, a.sizes.split(",")):
                load = os.getloadavg()[0]
                res = {ff: one(n, case, ff, Path(tmp)) for ff in (False, True)}
                (w0, m0, s0), (w1, m1, s1) = res[False], res[True]
                same = all(s0[k] == s1[k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms"))
                rows.append((case, n, s0["engine"]["num_iterations"], w0, m0, w1, m1, same,
                             load))
                print(rows[-1], flush=True)
    lines = [
        "# The simulator at scale: time and memory of whole `cbbench run` processes", "",
        "Command: `python tests/bench/bench_sim_scale.py --sizes " + a.sizes + " --cases "
        + a.cases + "`; each run `cbbench run --engine sim --gpu h200 --model llama-3-8b "
        "--workload sharegpt --num-requests N <case> [--no-fast-forward] --summary-only`, "
        "wall time and peak RSS by `/usr/bin/time`. Cases: " + "; ".join(
            f"{k}: `{' '.join(v)}`" for k, v in CASES.items()) + ".", "",
        "| case | requests | iterations | stepped: s | stepped: RSS MB | fast-forward: s | "
        "fast-forward: RSS MB | time ratio | summaries equal | 1-min load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, n, iters, w0, m0, w1, m1, same, load in rows:
        lines.append(f"| {case} | {n:,} | {iters:,} | {w0:.1f} | {m0 / 2**20:,.0f} | {w1:.1f} | "
                     f"{m1 / 2**20:,.0f} | {w1 / w0:.2f} | {same} | {load:.1f} |")
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
