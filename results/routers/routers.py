"""Routers side by side on one workload: prefix-cache hit rate, TTFT and throughput per router,
for the same requests and arrivals (the simulator is deterministic for a seed).

    python results/routers/routers.py [--sessions 200] [--rate 4]

writes results/routers/<workload>.md (the result files go to a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROUTERS = ("round-robin", "least-requests", "least-kv", "prefix-aware")
HERE = Path(__file__).parent


# The cbbench of the Python running this script, whatever is on PATH (a bare "cbbench" needed
# the environment on PATH and died with a traceback without it).
CBBENCH = [sys.executable, "-m", "cbbench"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="sharegpt-multiturn")
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--model", default="llama-3-8b")
    a = ap.parse_args()
    rows = []
    base = ["--engine", "sim", "--gpu", "h200", "--model", a.model, "--workload", a.workload,
            "--num-requests", str(a.sessions), "--request-rate", str(a.rate),
            "--data-parallel-size", str(a.dp), "--enable-prefix-caching", "--summary-only",
            "--json"]
    tmp = tempfile.mkdtemp()
    for router in ROUTERS:
        out = Path(tmp) / f"{router}.json"
        cmd = [*CBBENCH, "run", *base, "--router", router, "--output", str(out)]
        # Exit 1 is a run whose requests failed (e.g. beyond the context): its file stands.
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode not in (0, 1):
            raise SystemExit(f"failed: {' '.join(cmd)}")
        s = json.loads(out.read_text())["summary"]
        rows.append((router, s["engine"]["prefix_cache_hit_rate"], s["ttft_ms"]["p50"],
                     s["ttft_ms"]["p99"], s["tpot_ms"]["p50"], s["output_throughput"],
                     s["completed"], s["failed"]))
    load = os.getloadavg()
    lines = [
        f"# Routers on {Path(a.workload).name}, data parallel {a.dp} (simulated H200, {a.model})", "",
        "Same requests and arrivals for every router; hit rate = prefix-cache hit tokens over "
        "the tokens looked up, summed over the replicas (the engines' own counters).", "",
        "Command: `python results/routers/routers.py --workload "
        f"{Path(a.workload).name} --sessions {a.sessions} --rate {a.rate} --dp {a.dp} --model "
        f"{a.model}` (each run: "
        f"`cbbench run {' '.join(base)} --router R`)", "",
        f"Load average at the time: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (virtual clock: "
        "the figures do not depend on it)", "",
        "| router | hit rate | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | output tok/s "
        "| completed | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, hit, t50, t99, p50, thr, done, failed in rows:
        lines.append(f"| {r} | {hit:.3f} | {t50:.2f} | {t99:.2f} | {p50:.2f} | {thr:,.0f} "
                     f"| {done} | {failed} |")
    (HERE / f"{Path(a.workload).stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
