"""The simulator at scale: wall time and peak RSS of whole `cbbench run` processes at growing
request counts, this tree beside a reference revision run in the same session (issue 28's
scale target: 1M ShareGPT requests, llama-3-8b on the simulated H200, Poisson 400 req/s over
8 replicas, in <= 60 s and <= 2 GB).

    python tests/bench/bench_sim_scale.py --sizes 10000,100000 --ref-sizes 10000,100000 \\
        --reference main --identity 10000 --out results/sim_scale.md

Each run is a separate process; its wall time comes from the clock around it and its peak RSS
from the kernel's rusage of the child (the whole process). A run whose RSS passes --rss-limit
is killed (the machine is shared: a run past the target is not allowed to take it over) and
reported with the time and RSS it had reached. The reference is `git archive REV` of this
repository, run from a temporary folder with the same venv (PYTHONPATH ahead of the editable
install), so the ratio is measured under the same host load; `uptime`'s load is recorded
beside each row. --identity N runs both trees with --no-fast-forward --save-detailed on N
requests and compares the whole result (every token time, every iteration record, the
summary): the optimizations must not change a number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "dp8-400": ["--request-rate", "400", "--data-parallel-size", "8"],
    "dp1-50": ["--request-rate", "50"],
}
BASE = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--workload",
        "sharegpt"]
LAUNCH = "import sys; from cbbench.cli.app import main; sys.argv[0] = 'cbbench'; sys.exit(main())"
POLL_S = 0.2


def reference_tree(rev: str, dest: Path) -> Path:
    """``rev`` of this repository laid out as an importable ``cbbench`` package."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for sub in ("engine", "kernels", "workloads"):  # setuptools' package-dir mapping
        (dest / "cbbench" / sub).symlink_to(dest / sub)
    return dest


def run(args: list[str], ref: Path | None, rss_limit: float,
        cwd: Path) -> tuple[float, float, bool, float]:
    """(wall s, peak RSS bytes, completed, CPU s) of one process; killed past ``rss_limit``.
    CPU time beside the wall time: on a host shared with other work the wall time stretches
    with the load, the process's own CPU time much less."""
    env = dict(os.environ)
    if ref is not None:
        env["PYTHONPATH"] = str(ref)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    killed = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            rss_kb = next(int(line.split()[1]) for line in
                          Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                          if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            rss_kb = 0
        if rss_kb * 1024 > rss_limit and not killed:
            proc.kill()
            killed = True
        time.sleep(POLL_S)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 and not killed:
        raise RuntimeError(f"cbbench {' '.join(args)} exited {proc.returncode}")
    return wall, usage.ru_maxrss * 1024.0, not killed, usage.ru_utime + usage.ru_stime


def identity(n: int, case: str, ref: Path, tmp: Path) -> dict[str, bool]:
    """Both trees, stepped, every record kept: which parts of the result are equal."""
    outs = []
    for tree in (None, ref):
        out = tmp / f"identity-{'ref' if tree else 'this'}.json"
        run([*BASE, "--num-requests", str(n), *CASES[case], "--no-fast-forward",
             "--save-detailed", "--json", "--output", str(out)], tree, float("inf"), tmp)
        outs.append(json.loads(out.read_text()))
    a, b = outs
    return {k: a[k] == b[k] for k in ("requests", "iterations", "summary")}


POOLED = ("itl_ms", "event_gap_ms")  # per-token pools: a weighted mean adds in another order
POOLED_REL = 1e-9


def summaries_match(a, b, path: str = "summary") -> str:
    """'identical', 'equal (pooled means/stds to 1e-9)' (50,000+ requests go through the
    array simulator and its column summary: the pooled per-token means and standard
    deviations are sums taken in another order), or where they first differ."""
    import math

    loose = []

    def walk(x, y, p: str) -> str | None:
        if isinstance(y, dict):
            if not isinstance(x, dict) or list(x) != list(y):
                return p
            return next((d for k in y if (d := walk(x[k], y[k], f"{p}.{k}"))), None)
        if isinstance(y, list):
            if not isinstance(x, list) or len(x) != len(y):
                return p
            return next((d for i, (u, v) in enumerate(zip(x, y)) if (d := walk(u, v, f"{p}[{i}]"))),
                        None)
        if x == y:
            return None
        parts = p.split(".")
        if (len(parts) > 1 and parts[-2] in POOLED and parts[-1] in ("mean", "std")
                and isinstance(x, float) and math.isclose(x, y, rel_tol=POOLED_REL)):
            loose.append(p)
            return None
        return p

    where = walk(a, b, path)
    if where is not None:
        return f"DIFFERENT at {where}"
    return "equal (pooled means/stds to 1e-9)" if loose else "identical"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--ref-sizes", default="10000,100000")
    ap.add_argument("--case", default="dp8-400", choices=sorted(CASES))
    ap.add_argument("--reference", default="main", help="git revision to run beside this tree")
    ap.add_argument("--identity", type=int, default=10000, help="requests (0: skip)")
    ap.add_argument("--rss-limit-gb", type=float, default=4.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    limit = a.rss_limit_gb * 2**30
    ref_sizes = {int(s) for s in a.ref_sizes.split(",") if s}
    rows, same = [], None
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        ref = reference_tree(a.reference, tmp / "ref") if (ref_sizes or a.identity) else None
        for n in map(int, a.sizes.split(",")):
            load = os.getloadavg()[0]
            out = tmp / "r.json"
            args = [*BASE, "--num-requests", str(n), *CASES[a.case], "--summary-only",
                    "--json", "--output", str(out)]
            this = run(args, None, limit, tmp)
            iters = json.loads(out.read_text())["summary"]["engine"]["num_iterations"] \
                if this[2] else None
            summary = json.loads(out.read_text())["summary"] if this[2] else None
            other = run(args, ref, limit, tmp) if n in ref_sizes else None
            equal = (summaries_match(json.loads(out.read_text())["summary"], summary)
                     if other is not None and other[2] and summary is not None else None)
            rows.append((n, iters, this, other, equal, load))
            print(rows[-1], flush=True)
        # Last: a forked child's peak RSS (rusage) starts from its parent's, and the identity
        # check holds two whole results in this process.
        if a.identity:
            assert ref is not None
            same = identity(a.identity, a.case, ref, tmp)
            print("identity", same, flush=True)
    write(a, rows, same)


def write(a, rows, same) -> None:
    def cell(r) -> tuple[str, str]:
        wall, rss, done, cpu = r
        return (f"{wall:.1f} ({cpu:.1f} CPU)" + ("" if done else " (killed)"),
                f"{rss / 2**20:,.0f}")

    lines = [
        "# The simulator at scale: time and memory of whole `cbbench run` processes", "",
        "Command: `python tests/bench/bench_sim_scale.py " + " ".join(sys.argv[1:]) + "`; each "
        "run `cbbench " + " ".join(BASE) + " --num-requests N " + " ".join(CASES[a.case])
        + " --summary-only` (fast-forward on, the default), wall time around the process and "
        "its CPU time and peak RSS from rusage; `reference` is `git archive " + a.reference + "` run the "
        "same way in the same session. A run past --rss-limit-gb "
        f"{a.rss_limit_gb:g} is killed.", "",
    ]
    if same is not None:
        lines += [f"Identity ({a.identity:,} requests, both trees with --no-fast-forward "
                  f"--save-detailed, the whole result compared): "
                  + ", ".join(f"{k} {'identical' if v else 'DIFFERENT'}" for k, v in same.items())
                  + ".", ""]
    lines += [
        "| requests | iterations | this: s (CPU s) | this: RSS MB | this: CPU µs/iteration "
        "| reference: s (CPU s) | reference: RSS MB | CPU time ratio (this / reference) "
        "| summaries equal | 1-min load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, iters, this, other, equal, load in rows:
        s, m = cell(this)
        us = f"{this[3] / iters * 1e6:.0f}" if iters else "-"
        rs, rm = cell(other) if other is not None else ("-", "-")
        ratio = f"{this[3] / other[3]:.2f}" if other is not None and other[2] and this[2] else "-"
        lines.append(f"| {n:,} | {iters:,} | {s} | {m} | {us} | {rs} | {rm} | {ratio} | "
                     f"{equal if equal is not None else '-'} | {load:.1f} |"
                     if iters else
                     f"| {n:,} | - | {s} | {m} | - | {rs} | {rm} | {ratio} | - | {load:.1f} |")
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
