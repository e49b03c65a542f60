"""Issue 41's side-by-side benchmark, one command: this tree's load generator and a reference
commit's, against tests/timing_server.py (TTFT 150 ms, ITL 20 ms, 16 output tokens, Poisson
arrivals) at 500 and 1,000 req/s in one process and 2,000 req/s with --workers 2, held to the
server's own log; then the time from the `cbbench run` command to the server receiving its
first request, for both. Writes results/loadgen_rust_parity.md (figures and the command).

    python tests/bench/bench_loadgen_parity.py [--against f5e98e5] [--duration 4] [--repeats 2]
        [--nice -20] [--out results/loadgen_rust_parity.md]

Each rate is tests/bench/bench_loadgen_ab.py's comparison (the sides alternate, ref first;
CPU from getrusage; the timing server's own CPU beside). The issue's goals are checked on the
new side's medians and printed with each table. vLLM's Rust client is not run here (no wheel
was at hand to learn its command line); its figures are the issue's, from another session.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_loadgen_ab as ab  # tests/bench/, beside this file

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 16
TTFT_MS, ITL_MS = 150.0, 20.0
# (rate, client processes, the goals on the new side's medians: (figure, limit, "<=" or ">="))
POINTS = (
    (500.0, 1, (("ttft_err_p50_ms", 1.0, "<="),)),
    (1000.0, 1, (("ttft_err_p50_ms", 2.0, "<="), ("ttft_err_p99_ms", 20.0, "<="),
                 ("achieved_send_rate", 995.0, ">="), ("client_cpu_cores", 0.6, "<="))),
    (2000.0, 2, (("ttft_err_p50_ms", 3.0, "<="), ("achieved_send_rate", 1990.0, ">="))),
)
FIRST_REQUEST_RUNS = 2


def _point(args, rate: float, workers: int, work: Path) -> dict:
    ns = argparse.Namespace(
        against=args.against, new=["worktree"], requests=int(rate * args.duration),
        repeats=args.repeats, ttft_ms=TTFT_MS, itl_ms=ITL_MS, tokens=TOKENS,
        ref_dir=args.ref_dir, json_out=str(work / f"rate{int(rate)}.json"), nice=None,
        records_dir=None, profile_dir=None, rate=rate, duration=args.duration,
        arrival="poisson", seed=0, workers=workers,
    )
    return ab.compare(ns)


def _first_request(cbbench: str, url: str, fetch_log) -> list[float]:
    """Seconds from starting `cbbench run` to the server receiving its first request."""
    out = []
    for _ in range(FIRST_REQUEST_RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            proc = subprocess.run(
                [cbbench, "run", "--endpoint", url, "--served-model", ab.MODEL, "--workload",
                 "random", "--input-len", "16", "--output-len", str(TOKENS), "--num-requests",
                 "20", "--request-rate", "100", "--output", str(Path(tmp) / "r.json")],
                capture_output=True, text=True, timeout=300,
            )
        log = fetch_log(url, clear=True)
        if proc.returncode != 0 or not log:
            raise SystemExit(f"{cbbench} run failed:\n{proc.stderr[-2000:]}")
        out.append(min(e["received"] for e in log.values()) - t)
    return out


def _checks(summary: dict, goals) -> list[str]:
    lines = []
    for key, limit, how in goals:
        got = summary["new"][key]["median"]
        ok = got <= limit if how == "<=" else got >= limit
        lines.append(f"- {key} {got:.3g} (goal {how} {limit:g}): {'met' if ok else 'NOT met'}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="f5e98e5", help="the reference commit")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of schedule per run")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ref-dir", help="where the reference commit is unpacked (default: temp)")
    ap.add_argument("--nice", type=int, help="run in a scheduler group of its own (see ab)")
    ap.add_argument("--out", default=str(ROOT / "results" / "loadgen_rust_parity.md"))
    args = ap.parse_args()
    if args.nice is not None:
        ab._own_cpu_share(args.nice)
    command = " ".join(["python", "tests/bench/bench_loadgen_parity.py", *sys.argv[1:]])
    started = ab._uptime()
    sections = []
    with tempfile.TemporaryDirectory(prefix="cbbench-parity-") as work:
        for rate, workers, goals in POINTS:
            result = _point(args, rate, workers, Path(work))
            sides = [ab.Side(name, label, "") for name, label in result["sides"].items()]
            where = "one process" if workers == 1 else f"--workers {workers}"
            sections.append(
                f"### {rate:g} req/s, {where}\n\n{ab.table(result['summary'], sides)}\n\n"
                + "\n".join(_checks(result["summary"], goals))
                + f"\n\n(load: {result['uptime_before']} -> {result['uptime_after']})\n"
            )
        sys.path.insert(0, str(ROOT / "tests"))
        from timing_server import fetch_log, timing_server

        ref = ab.commit_side("ref", args.against, Path(args.ref_dir or tempfile.gettempdir()))
        ref_cbbench = str(Path(ref.python).parent / "cbbench")
        new_cbbench = str(Path(sys.executable).parent / "cbbench")
        with timing_server(TTFT_MS, ITL_MS) as url:
            fetch_log(url, clear=True)
            firsts = {ref.label: _first_request(ref_cbbench, url, fetch_log),
                      "worktree": _first_request(new_cbbench, url, fetch_log)}
    first_lines = "\n".join(
        f"| {label} | {', '.join(f'{s:.2f}' for s in secs)} |" for label, secs in firsts.items())
    text = (
        "# The load generator beside a compiled client (issue 41)\n\n"
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.processor() or platform.machine()}. Load before: {started}; "
        f"after: {ab._uptime()}.\n\n```\n{command}\n```\n\n"
        f"Against tests/timing_server.py (TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms, {TOKENS} "
        "output tokens, Poisson arrivals), each client's TTFT held to the server's own log. "
        "Median of the runs per side, ratio new/ref.\n\n" + "\n".join(sections)
        + "\n### From the command to the first request (s)\n\n| client | runs |\n| --- | --- |\n"
        + first_lines + "\n"
    )
    out = Path(args.out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(out)  # atomically
    print(text)
    print(json.dumps({"written": str(out)}))


if __name__ == "__main__":
    main()
