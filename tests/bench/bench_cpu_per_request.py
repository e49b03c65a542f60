"""CPU seconds per request of the timing server and of one client, side by side in one run.

    python tests/bench/bench_cpu_per_request.py --rate 1000 [--workers 1] [--requests 4000]
        [--server worktree --server REV ...] [--client worktree --client REV ...]
        [--rounds 2] [--profile-dir DIR]

On a machine other work shares, wall-clock figures (TTFT error, send lag) read the machine; CPU
seconds per request read the code. Every (server, client) pair given runs the same Poisson
schedule against its own tests/timing_server.py process (TTFT 150 ms, ITL 20 ms, 16 output
tokens); the pairs alternate (ABBA) over the rounds. Per run: the server's user and kernel CPU
per request (from /proc/PID/stat, so a commit's server needs no help from its code), the
client's (getrusage over its call, the workers included: bench_loadgen_ab.client_main), the
TTFT error against the server's log and the server's own TTFT p50 (did it keep up?).

A server side is `worktree` or a commit whose tests/timing_server.py is run (`git show`); a
client side is bench_loadgen_ab.side_for's (`worktree`, a commit, `+asyncio`). With
--profile-dir, each run's client is cProfiled (bench_loadgen_ab's --profile) and a worktree
server too (its --profile). Results: results/loadgen_cpu_per_request.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import bench_loadgen_ab as ab  # tests/bench/, beside this file
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 16
TTFT_MS, ITL_MS = 150.0, 20.0
TICKS = os.sysconf("SC_CLK_TCK")
# SPY_NATIVE=1: C frames too (uvloop, orjson, httptools); py-spy then pauses the process to read them.
SPY_MODE = ["--native"] if os.environ.get("SPY_NATIVE") else ["--nonblocking"]


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(user, kernel) CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime


def _connections(url: str) -> float:
    """Connections the server accepted so far (nan: a server that does not count them)."""
    with urllib.request.urlopen(url + "/cpu", timeout=30) as resp:
        return float(json.loads(resp.read()).get("connections", "nan"))


def _server_file(rev: str, work: Path) -> Path:
    if rev == "worktree":
        return ROOT / "tests" / "timing_server.py"
    path = work / f"timing_server_{rev}.py"
    path.write_text(ab._git("show", f"{rev}:tests/timing_server.py"))
    return path


def _start_server(path: Path, profile: str | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(path), "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]
    if profile:
        cmd += ["--profile", profile]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.strip().isdigit():
        proc.kill()
        raise SystemExit(f"the timing server {path} did not start (said {line!r})")
    return proc, f"http://127.0.0.1:{int(line)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server", action="append", help="worktree (default) or REV; repeatable")
    ap.add_argument("--client", action="append", help="worktree (default) or REV; repeatable")
    ap.add_argument("--profile-dir")
    ap.add_argument("--spy-dir", help="py-spy (sampling, --native off) the server and the client "
                    "(its workers too) into DIR/*.txt, collapsed stacks")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from timing_server import fetch_log

    from cbbench.load.arrivals import arrival_times
    from cbbench.load.workload import WorkloadRequest

    wreqs = [WorkloadRequest(i, ab.PROMPT_LEN, TOKENS) for i in range(args.requests)]
    arrivals = [float(a) for a in arrival_times(wreqs, args.rate, 1.0, "gamma", args.seed)]
    servers = args.server or ["worktree"]
    clients = args.client or ["worktree"]
    base = Path(tempfile.gettempdir())
    client_sides = {c: ab.side_for("new", c, base) for c in clients}
    pairs = list(itertools.product(servers, clients))
    rows: dict[tuple[str, str], list[dict]] = {p: [] for p in pairs}
    print(f"# {ab._uptime()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="cbbench-cpu-") as tmp:
        work = Path(tmp)
        files = {s: _server_file(s, work) for s in servers}
        for k in range(args.rounds):
            for srv, cli in pairs if k % 2 == 0 else pairs[::-1]:
                tag = f"r{k}{abs(hash((srv, cli))) % 10000}"
                prof_dir = Path(args.profile_dir).resolve() if args.profile_dir else None
                sprof = (str(prof_dir / f"server-{srv}-{k}.prof")
                         if prof_dir and srv == "worktree" else None)
                proc, url = _start_server(files[srv], sprof)
                spies = []
                side = client_sides[cli]
                if args.spy_dir:
                    spy = Path(args.spy_dir).resolve()
                    spy.mkdir(parents=True, exist_ok=True)
                    spies.append(subprocess.Popen(
                        ["py-spy", "record", "-p", str(proc.pid), "-r", "200", *SPY_MODE,
                         "-f", "raw", "-o", str(spy / f"server-{srv}-{k}.txt")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                    wrapper = work / f"spy-{k}.sh"
                    wrapper.write_text(
                        f"#!/bin/sh\nexec py-spy record -s -r 200 {' '.join(SPY_MODE)} -f raw -o "
                        f"{spy / f'client-{cli}-{k}.txt'} -- {side.python} \"$@\"\n")
                    wrapper.chmod(0o755)
                    side = ab.Side(side.name, side.label, str(wrapper), side.env)
                try:
                    fetch_log(url, clear=True)
                    spec = {"url": url, "tag": tag, "tokens": TOKENS, "arrivals": arrivals,
                            "workers": args.workers}
                    if prof_dir:
                        spec["profile"] = str(prof_dir / f"client-{cli}-{k}.prof")
                    c0 = _connections(url)
                    u0, s0 = _proc_cpu(proc.pid)
                    load = os.getloadavg()[0]
                    try:
                        out = ab._run_client(side, spec, work,
                                             arrivals[-1] + ab.CLIENT_TIMEOUT_MARGIN_S)
                    except (subprocess.TimeoutExpired, SystemExit) as e:  # one run lost, not all
                        print(json.dumps({"server": srv, "client": cli, "round": k,
                                          "lost": str(e)[-300:]}), flush=True)
                        continue
                    u1, s1 = _proc_cpu(proc.pid)
                    conns = _connections(url) - c0
                    fig = ab.figures(out, fetch_log(url, clear=True), tag, args.requests)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                    for sp in spies:
                        sp.wait(timeout=30)
                n = args.requests
                row = {
                    "server_us": (u1 - u0 + s1 - s0) / n * 1e6,
                    "server_sys_us": (s1 - s0) / n * 1e6,
                    "client_us": fig["client_cpu_us_per_request"],
                    "client_sys_us": fig["client_sys_cpu_us_per_request"],
                    "ttft_err_p50_ms": fig["ttft_err_p50_ms"],
                    "server_ttft_p50_ms": fig["server_ttft_p50_ms"],
                    "send_lag_p50_ms": fig["send_lag_p50_ms"],
                    "achieved_over_schedule": fig["achieved_over_schedule"],
                    "failed": fig["failed"],
                    "connections": conns,
                    "load": load,
                }
                rows[(srv, cli)].append(row)
                print(json.dumps({"server": srv, "client": cli, "round": k, **row}), flush=True)
    done = [rs[0] for rs in rows.values() if rs]
    if not done:
        raise SystemExit("every run was lost")
    keys = list(done[0])
    print(f"\nrate {args.rate:g} req/s, --workers {args.workers}, {args.requests} requests, "
          f"{TOKENS} tokens; median of {args.rounds} rounds (ABBA); {ab._uptime()}\n")
    print("| server | client | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for (srv, cli), rs in rows.items():
        if not rs:
            print(f"| {srv} | {cli} | " + " | ".join("lost" for _ in keys) + " |")
            continue
        med = [float(np.median([r[key] for r in rs])) for key in keys]
        print(f"| {srv} | {cli} | " + " | ".join(f"{v:.3g}" for v in med) + " |")


if __name__ == "__main__":
    main()
