"""Issue 41's side-by-side benchmark, one command: this tree's load generator and a reference
commit's, against tests/timing_server.py (TTFT 150 ms, ITL 20 ms, 16 output tokens, Poisson
arrivals) at 500 and 1,000 req/s in one process and 2,000 req/s with --workers 2, held to the
server's own log; then the time from the `cbbench run` command to the server receiving its
first request, for both. Writes results/loadgen_rust_parity.md (figures and the command).

    python tests/bench/bench_loadgen_parity.py [--against f5e98e5] [--duration 4] [--repeats 2]
        [--rates 500 1000 2000] [--nice -20] [--out results/loadgen_rust_parity.md]

Each rate is tests/bench/bench_loadgen_ab.py's comparison (the sides alternate, ref first;
CPU from getrusage; the timing server's own CPU beside). The issue's goals are checked on the
new side's medians and printed with each table.

vLLM's Rust client, opt-in: CBBENCH_BENCH_VLLM_RS names its binary (`vllm/vllm-rs` inside the
vllm 0.34.0 wheel runs on its own: `pip download --no-deps vllm==0.34.0`, unzip that one file;
never commit it). It runs `vllm-rs bench serve` right after cbbench's runs at each rate (the same
load), against a timing server of its own, with the arguments `VLLM_USE_RUST_BENCH=1 vllm bench
serve` hands it (vllm's CLI execs the binary with its own argv),
with a tokenizer (its random dataset needs one: CBBENCH_BENCH_TOKENIZER, default the shared
Llama-3.1 one beside the repository). Its prompts are its own, so its figures are held to the
server's log by distribution (its TTFT p50/p99 minus the server's), not per request, and its
TTFT counts from its actual send (vLLM's convention; cbbench's from the intended start).
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
# "995 req/s reached at 1000" is read against the rate of the Poisson schedule the client was
# given (achieved / schedule's own rate >= 99.5%): a 4 s draw of 4,000 arrivals itself runs
# ~1.6% fast or slow, which the raw send rate (also in the table) carries.
POINTS = (
    (500.0, 1, (("ttft_err_p50_ms", 1.0, "<="),)),
    (1000.0, 1, (("ttft_err_p50_ms", 2.0, "<="), ("ttft_err_p99_ms", 20.0, "<="),
                 ("achieved_over_schedule", 0.995, ">="), ("client_cpu_cores", 0.6, "<="))),
    (2000.0, 2, (("ttft_err_p50_ms", 3.0, "<="), ("achieved_over_schedule", 0.995, ">="))),
)
FIRST_REQUEST_RUNS = 2
VLLM_RS_ENV = "CBBENCH_BENCH_VLLM_RS"
TOKENIZER_ENV = "CBBENCH_BENCH_TOKENIZER"
SHARED_TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "llama-3.1"


def _vllm_rs(binary: str, rate: float, n: int, work: Path) -> dict:
    """One `vllm-rs bench serve` run against a timing server of its own; its figures."""
    import resource

    import numpy as np
    from timing_server import fetch_cpu, fetch_log, timing_server

    tokenizer = os.environ.get(TOKENIZER_ENV) or str(SHARED_TOKENIZER)
    with timing_server(TTFT_MS, ITL_MS) as url:
        fetch_log(url, clear=True)
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        server0 = fetch_cpu(url)
        started = time.perf_counter()  # the server's clock (perf_counter: CLOCK_MONOTONIC)
        proc = subprocess.run(
            [binary, "bench", "serve", "--backend", "openai", "--base-url", url, "--model",
             ab.MODEL, "--tokenizer", tokenizer, "--dataset-name", "random",
             "--random-input-len", "64", "--random-output-len", str(TOKENS), "--num-prompts",
             str(n), "--request-rate", str(rate), "--disable-tqdm", "--save-result",
             "--save-detailed", "--result-dir", str(work), "--result-filename", "rs.json"],
            capture_output=True, text=True, timeout=ab.CLIENT_TIMEOUT_MARGIN_S + n / rate,
        )
        kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu = fetch_cpu(url) - server0
        log = fetch_log(url, clear=True)
    if proc.returncode != 0:
        raise SystemExit(f"vllm-rs failed:\n{proc.stderr[-2000:]}")
    res = json.loads((work / "rs.json").read_text())
    server = [(e["first_token"] - e["received"]) * 1e3 for e in log.values() if "first_token" in e]
    ttft = [t * 1e3 for t in res["ttfts"] if t]
    starts = sorted(res["start_times"])
    cpu = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    return {
        "ttft_p50_minus_server_ms": float(np.percentile(ttft, 50) - np.percentile(server, 50)),
        "ttft_p99_minus_server_ms": float(np.percentile(ttft, 99) - np.percentile(server, 99)),
        "achieved_send_rate": (len(starts) - 1) / (starts[-1] - starts[0]),
        "completed": res["completed"],
        "client_cpu_cores": cpu / res["duration"],  # its whole call over its run's duration
        "client_cpu_us_per_request": cpu / n * 1e6,
        "server_cpu_us_per_request": server_cpu / n * 1e6,
        # from the command to the server receiving its first request (tokenizer, dataset)
        "to_first_request_s": min(e["received"] for e in log.values()) - started,
    }


VLLM_RS_HEAD = (
    "| client | TTFT p50 / p99 - server's (ms) | send rate | completed | client cores "
    "(whole call) | client CPU per request (us) | server CPU per request (us) "
    "| to first request (s) | load before |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)
VLLM_RS_NOTE = (
    "vLLM's Rust client right after cbbench's runs at this rate, one process, the arguments "
    "`VLLM_USE_RUST_BENCH=1 vllm bench serve` passes on (vllm's CLI execs `vllm-rs bench serve` "
    "with its own argv): openai backend, random dataset, 64-token prompts, 16 output tokens, "
    "Poisson arrivals at --request-rate. Its TTFT counts from its own send and is held to the "
    "server's log by distribution (cbbench's row beside it: the same two figures, from the "
    "table above)."
)


def _vllm_rs_rows(binary: str, rate: float, args, work: Path, result: dict) -> str:
    """vllm-rs at `rate` just after cbbench's runs there, beside cbbench's same figures."""
    import numpy as np

    load = ab._uptime().split("load average:")[-1].strip()
    f = _vllm_rs(binary, rate, int(rate * args.duration), work)
    runs = [r for r in result["runs"] if r["side"] == "new"]

    def med(fn) -> float:
        return float(np.median([fn(r) for r in runs]))

    return (
        f"{VLLM_RS_NOTE}\n\n{VLLM_RS_HEAD}\n"
        f"| vllm-rs | {f['ttft_p50_minus_server_ms']:+.1f} / "
        f"{f['ttft_p99_minus_server_ms']:+.1f} | {f['achieved_send_rate']:.1f} | "
        f"{f['completed']} | {f['client_cpu_cores']:.2f} | "
        f"{f['client_cpu_us_per_request']:.0f} | {f['server_cpu_us_per_request']:.0f} | "
        f"{f['to_first_request_s']:.2f} | {load} |\n"
        f"| cbbench (this tree, median of {len(runs)}) | "
        f"{med(lambda r: r['ttft_p50_ms'] - r['server_ttft_p50_ms']):+.1f} / "
        f"{med(lambda r: r['ttft_p99_over_server_ms']):+.1f} | "
        f"{med(lambda r: r['achieved_send_rate']):.1f} | {med(lambda r: r['completed']):.0f} | "
        f"{med(lambda r: r['client_cpu_cores']):.2f} | "
        f"{med(lambda r: r['client_cpu_us_per_request']):.0f} | "
        f"{med(lambda r: r['server_cpu_us_per_request']):.0f} | (last table) | "
        f"{runs[0]['loadavg_1min_before']:.2f} (1 min) |\n"
    )


def _point(args, rate: float, workers: int, work: Path) -> dict:
    ns = argparse.Namespace(
        against=args.against, new=["worktree"], requests=int(rate * args.duration),
        repeats=args.repeats, ttft_ms=TTFT_MS, itl_ms=ITL_MS, tokens=TOKENS,
        ref_dir=args.ref_dir, json_out=str(work / f"rate{int(rate)}.json"), nice=None,
        records_dir=None, profile_dir=None, rate=rate, duration=args.duration,
        arrival="poisson", seed=0, workers=workers,
    )
    return ab.compare(ns)


def _first_request(cbbench: str, url: str, fetch_log, env: dict[str, str]) -> list[float]:
    """Seconds from starting `cbbench run` to the server receiving its first request."""
    out = []
    for _ in range(FIRST_REQUEST_RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            proc = subprocess.run(
                [cbbench, "run", "--endpoint", url, "--served-model", ab.MODEL, "--workload",
                 "random", "--input-len", "16", "--output-len", str(TOKENS), "--num-requests",
                 "20", "--request-rate", "100", "--output", str(Path(tmp) / "r.json")],
                capture_output=True, text=True, timeout=300, env=env,
            )
        log = fetch_log(url, clear=True)
        if proc.returncode != 0 or not log:
            raise SystemExit(f"{cbbench} run failed:\n{proc.stderr[-2000:]}")
        out.append(min(e["received"] for e in log.values()) - t)
    return out


def _start_envs(cache: Path) -> dict[str, dict[str, str]]:
    """How the command starts: as an installed package does (its modules' bytecode cached,
    here under a temporary PYTHONPYCACHEPREFIX, filled by one uncounted run first), and
    compiling every module from source (PYTHONDONTWRITEBYTECODE=1, as some sandboxes set it:
    a source tree that never keeps its bytecode)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    return {"bytecode cached": {**base, "PYTHONPYCACHEPREFIX": str(cache)},
            "no bytecode": {**base, "PYTHONDONTWRITEBYTECODE": "1"}}


def _points(args) -> tuple:
    """The points --rates picks (all three by default)."""
    return tuple(p for p in POINTS if not args.rates or p[0] in args.rates)


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
    ap.add_argument("--rates", type=float, nargs="*", help="only these of 500 1000 2000")
    ap.add_argument("--out", default=str(ROOT / "results" / "loadgen_rust_parity.md"))
    args = ap.parse_args()
    if args.nice is not None:
        ab._own_cpu_share(args.nice)
    command = " ".join(["python", "tests/bench/bench_loadgen_parity.py", *sys.argv[1:]])
    if os.environ.get(VLLM_RS_ENV):  # the binary's path is this machine's: named, not shown
        command = f"{VLLM_RS_ENV}=<path of vllm-rs> {command}"
    started = ab._uptime()
    sections = []
    binary = os.environ.get(VLLM_RS_ENV)
    with tempfile.TemporaryDirectory(prefix="cbbench-parity-") as work:
        for rate, workers, goals in _points(args):
            result = _point(args, rate, workers, Path(work))
            sides = [ab.Side(name, label, "") for name, label in result["sides"].items()]
            where = "one process" if workers == 1 else f"--workers {workers}"
            sections.append(
                f"### {rate:g} req/s, {where}\n\n{ab.table(result['summary'], sides)}\n\n"
                + "\n".join(_checks(result["summary"], goals))
                + f"\n\n(load: {result['uptime_before']} -> {result['uptime_after']})\n"
            )
            if binary:
                sections.append(_vllm_rs_rows(binary, rate, args, Path(work), result))
        sys.path.insert(0, str(ROOT / "tests"))
        from timing_server import fetch_log, timing_server

        if not binary:
            sections.append(f"(vLLM's Rust client not run: {VLLM_RS_ENV} names no binary)\n")

        ref = ab.commit_side("ref", args.against, Path(args.ref_dir or tempfile.gettempdir()))
        ref_cbbench = str(Path(ref.python).parent / "cbbench")
        new_cbbench = str(Path(sys.executable).parent / "cbbench")
        firsts: dict[tuple[str, str], list[float]] = {}
        first_load = ab._uptime()
        with timing_server(TTFT_MS, ITL_MS) as url:
            fetch_log(url, clear=True)
            for how, env in _start_envs(Path(work) / "pycache").items():
                for label, exe in ((ref.label, ref_cbbench), ("worktree", new_cbbench)):
                    if how == "bytecode cached":  # fill the cache: not counted
                        _first_request(exe, url, fetch_log, env)
                    firsts[(label, how)] = _first_request(exe, url, fetch_log, env)
    first_lines = "\n".join(
        f"| {label} | {how} | {', '.join(f'{s:.2f}' for s in secs)} |"
        for (label, how), secs in firsts.items())
    text = (
        "# The load generator beside a compiled client (issue 41)\n\n"
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.processor() or platform.machine()}. Load before: {started}; "
        f"after: {ab._uptime()}.\n\n```\n{command}\n```\n\n"
        f"Against tests/timing_server.py (TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms, {TOKENS} "
        "output tokens, Poisson arrivals), each client's TTFT held to the server's own log. "
        "Median of the runs per side, ratio new/ref.\n\n" + "\n".join(sections)
        + "\n### From the command to the first request (s)\n\n"
        + "`cbbench run --endpoint ... --served-model ... --request-rate 100` (load before: "
        + f"{first_load}).\n\n| client | start | runs |\n| --- | --- | --- |\n"
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
