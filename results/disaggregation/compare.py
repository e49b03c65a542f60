"""Colocated (data parallel 2) vs disaggregated 1:1 prefill/decode on the same two simulated
GPUs: TTFT, TPOT, KV transfer time and goodput per GPU under a TTFT and a TPOT SLO, at each
request rate (DistServe's comparison: the rate each design sustains per GPU within the SLOs).

    python results/disaggregation/compare.py [--rates 1,2,3,4,5] [--num-requests 400]

writes results/disaggregation/compare.md (the same requests and arrivals for both designs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
DESIGNS = {"colocated DP 2": ["--data-parallel-size", "2", "--router", "least-requests"],
           "disaggregated 1:1": ["--disaggregate", "1:1", "--router", "least-requests"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1,2,3,4,5,6")
    ap.add_argument("--num-requests", type=int, default=400)
    ap.add_argument("--slo", default="ttft=1000,tpot=25")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--kv-link", default="nvlink")
    ap.add_argument("--workload", default="long-prompt")
    a = ap.parse_args()
    base = ["--engine", "sim", "--gpu", a.gpu, "--model", "llama-3-8b", "--workload",
            a.workload, "--num-requests", str(a.num_requests), "--slo", a.slo,
            "--kv-link", a.kv_link, "--summary-only", "--json"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate in a.rates.split(","):
            for name, flags in DESIGNS.items():
                out = Path(tmp) / "r.json"
                subprocess.run([sys.executable, "-m", "cbbench", "run", *base, "--request-rate", rate, *flags,
                                "--output", str(out)], check=True, stdout=subprocess.DEVNULL)
                s = json.loads(out.read_text())["summary"]
                kv = s.get("kv_transfer_ms")
                rows.append((rate, name, s["ttft_ms"]["p50"], s["ttft_ms"]["p99"],
                             s["tpot_ms"]["p50"], s["tpot_ms"]["p99"],
                             kv["p50"] if kv else None, kv["p99"] if kv else None,
                             s["slo_attainment"], s["goodput_per_gpu"], s["gpus"]))
    load = os.getloadavg()
    lines = [
        f"# Colocated vs disaggregated prefill/decode: {a.workload}, simulated {a.gpu}, "
        "llama-3-8b, 2 GPUs each", "",
        f"SLO: {a.slo} (ms). Goodput per GPU = requests per second meeting both SLOs, over "
        "the GPUs (DistServe). Same requests and Poisson arrivals (seed 0) for both designs; "
        f"KV over {a.kv_link}; router least-requests; chunked prefill, budget 2048.", "",
        f"Command: `python results/disaggregation/compare.py --rates {a.rates} --num-requests "
        f"{a.num_requests} --slo {a.slo} --gpu {a.gpu} --kv-link {a.kv_link} --workload "
        f"{a.workload}` (each run: `cbbench run {' '.join(base)} --request-rate R` plus the "
        "design's flags: " + "; ".join(f"{k}: `{' '.join(v)}`" for k, v in DESIGNS.items())
        + ")", "",
        f"Load average at the time: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (virtual clock: "
        "the figures do not depend on it)", "",
        "| req/s | design | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | KV transfer p50 | "
        "KV transfer p99 | SLO attainment | goodput / GPU (req/s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ms(v):
        return "-" if v is None else f"{v:,.1f}"

    for rate, name, t50, t99, p50, p99, k50, k99, att, gpg, _g in rows:
        lines.append(f"| {rate} | {name} | {ms(t50)} | {ms(t99)} | {ms(p50)} | {ms(p99)} | "
                     f"{'-' if k50 is None else f'{k50:.2f}'} | "
                     f"{'-' if k99 is None else f'{k99:.2f}'} | {att:.1%} | {gpg:.3f} |")
    (HERE / "compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
