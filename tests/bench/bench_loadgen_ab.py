"""Side by side: this tree's HTTP client against another commit's, interleaved, against one
server of known timing. The client's accuracy as a benchmark that compares commits.

    python tests/bench/bench_loadgen.py --against 6a0ec45 [--new REV ...] [--rate 500] [--requests 7500]
        [--repeats 3] [--arrival poisson] [--ttft-ms 150] [--itl-ms 20] [--tokens 4]
        [--workers N] [--json-out FILE]

Each side is a client process of its own: the working tree's (this interpreter, its editable
install) or a commit's (`git archive` of it unpacked in the temp folder, with a venv that sees
this venv's packages and installs the commit with `pip install --no-deps -e`; made once, kept).
Both replay the same schedule (one arrival draw, made here) through their own `run_http`
(`run_load` for --workers N, which a commit must have) against one tests/timing_server.py
process (TTFT and ITL on absolute deadlines, and a log of when each request arrived and each
token was written). Rounds alternate ref, new, new, ref, ... so all sides see the same hour;
`--new` may be given several times (`--new 8169f12 --new worktree`: before and after a fix,
each against the reference, in one run).

Per run: the TTFT error against the server's own log (client TTFT, counted from the intended
start, minus the server's received -> first token written, per request), the send lag (send -
intended start), the achieved send rate, and the client's CPU from getrusage: over the run in
cores (one process: from the first request's end to the last one's, seen through the progress
callback every commit has; --workers: the whole call, the reaped workers included), and per
request over the whole call (set-up and the analysis after the run too). The summary gives each
side's median over the repeats and the ratio new/ref (of the medians, and the range of the
per-pair ratios). Results: results/loadgen_capacity.md.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import inspect
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODEL = "timing-model"  # what tests/timing_server.py serves
PROMPT_LEN = 2  # the prompt's length in the workload (the server ignores it)
READY_MARK = ".bench-ready"
CLIENT_TIMEOUT_MARGIN_S = 120.0  # a run may take this much longer than its schedule
# What the summary compares, in the order printed: (key in a run's figures, label).
FIGURES = (
    ("ttft_err_p50_ms", "TTFT error p50 (ms)"),
    ("ttft_err_p99_ms", "TTFT error p99 (ms)"),
    ("ttft_p99_over_server_ms", "TTFT p99 - server's TTFT p99 (ms)"),
    ("send_lag_p50_ms", "send lag p50 (ms)"),
    ("send_lag_p99_ms", "send lag p99 (ms)"),
    ("send_lag_max_ms", "send lag max (ms)"),
    ("achieved_send_rate", "achieved send rate (req/s)"),
    ("schedule_rate", "the schedule's own rate (req/s)"),
    ("achieved_over_schedule", "achieved / schedule's rate"),
    ("client_cpu_cores", "client CPU over the run (cores)"),
    ("client_cpu_us_per_request", "client CPU per request, whole call (us)"),
    ("client_sys_cpu_us_per_request", "of which in the kernel (us)"),
    ("server_cpu_us_per_request", "the timing server's CPU per request (us)"),
    ("server_ttft_p50_ms", "the server's own TTFT p50 (ms)"),
    ("minor_faults_per_request", "minor page faults per request"),
    ("gc_collections", "GC collections in the client"),
    ("gc_pause_total_ms", "GC pauses, total (ms)"),
    ("gc_pause_max_ms", "longest GC pause (ms)"),
)


# ---- the sides ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    name: str  # "ref" or "new"
    label: str  # the commit (short sha), or "worktree"
    python: str  # the interpreter whose `import cbbench` is this side's client
    env: tuple[tuple[str, str], ...] = ()  # set in the client's environment


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def _imports_aiohttp(py: Path) -> bool:
    return py.exists() and subprocess.run(
        [str(py), "-c", "import aiohttp"], capture_output=True, cwd=tempfile.gettempdir()
    ).returncode == 0


def commit_side(name: str, rev: str, base_dir: Path) -> Side:
    """A venv with commit `rev` installed (editable, over this venv's packages); made once."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = base_dir / f"cbbench-bench-{sha[:12]}"
    py = tree / ".venv" / "bin" / "python"
    # A tree made by another venv's run, whose packages are gone since, is made again.
    if not (tree / READY_MARK).exists() or not _imports_aiohttp(py):
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", sha], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tree / ".venv")],
                       check=True)
        # The commit's own dependencies are this venv's: a .pth line adds the folder to
        # sys.path without running its .pth files (so this tree's editable cbbench stays out).
        site = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        # And the site folders this venv chains to (a venv layered over another by a .pth).
        ours |= {p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()}
        Path(site, "_bench_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
        install = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                   "--no-deps", "-e", str(tree)]
        # Without build isolation first (no index needed); a venv whose setuptools is too old
        # for the commit's pyproject.toml builds it in an isolated environment instead.
        if subprocess.run([*install, "--no-build-isolation"], cwd=tree,
                          capture_output=True).returncode != 0:
            subprocess.run(install, check=True, cwd=tree)
        (tree / READY_MARK).write_text(sha + "\n")
    got = subprocess.run(
        [str(py), "-c", "import cbbench, os; print(os.path.dirname(cbbench.__file__))"],
        check=True, capture_output=True, text=True, cwd=tempfile.gettempdir(),
    ).stdout.strip()
    if Path(got).resolve() != (tree / "cbbench").resolve():
        raise SystemExit(f"the {name} side imports cbbench from {got}, not from {tree}")
    return Side(name, sha[:7], str(py))


LOOP_ENV = "CBBENCH_CLIENT_LOOP"  # cbbench/targets/client_loop.py


def side_for(name: str, rev: str, base: Path) -> Side:
    """REV, 'worktree', or either with '+asyncio': its client on asyncio's standard loop."""
    rev, _, loop = rev.partition("+")
    side = worktree_side(name) if rev == "worktree" else commit_side(name, rev, base)
    if loop:
        side = Side(side.name, f"{side.label}+{loop}", side.python, ((LOOP_ENV, loop),))
    return side


def worktree_side(name: str) -> Side:
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "cbbench", "engine")
    return Side(name, _git("rev-parse", "--short=7", "HEAD") + ("+dirty" if dirty else ""),
                sys.executable)


# ---- one client run (the client's own process) ------------------------------------------------
class _RunWindow:
    """CPU and wall time between the first and the last progress callback of a run."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None

    def progress(self, done: int, total: int) -> None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        mark = (time.perf_counter(), ru.ru_utime + ru.ru_stime)
        if self.first is None:
            self.first = mark
        self.last = mark

    def result(self) -> dict | None:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        return {"wall_s": self.last[0] - self.first[0], "cpu_s": self.last[1] - self.first[1]}


class _GcPauses:
    """The garbage collector's pauses in the client's process (they stall its event loop)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._t = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t))

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)

    def result(self) -> dict:
        full = [s for g, s in self.pauses if g == 2]
        return {
            "collections": len(self.pauses),
            "full_collections": len(full),
            "pause_total_ms": sum(s for _, s in self.pauses) * 1e3,
            "pause_max_ms": max((s for _, s in self.pauses), default=0.0) * 1e3,
            "full_pause_max_ms": max(full, default=0.0) * 1e3,
            "tracked_objects_after": len(gc.get_objects()),
        }


def client_main(spec_path: str, out_path: str) -> None:
    """Run one side's client on the spec's schedule; write its records and CPU time."""
    import aiohttp  # noqa: F401  imported before the clock: not part of the measured CPU

    spec = json.loads(Path(spec_path).read_text())
    try:
        from cbbench.load.workload import WorkloadRequest
        from cbbench.targets.http import EndpointOptions, run_http
    except ImportError:  # the layout before the cbbench/ subpackages (e.g. 6a0ec45)
        from cbbench.http_target import EndpointOptions, run_http
        from cbbench.workload import WorkloadRequest
    tag, tokens = spec["tag"], spec["tokens"]
    arrivals = np.asarray(spec["arrivals"], dtype=np.float64)
    wreqs = [
        WorkloadRequest(i, PROMPT_LEN, tokens, prompt=f"{tag}-{i}") for i in range(len(arrivals))
    ]
    opts = EndpointOptions(spec["url"], served_model=MODEL)
    notices: list[str] = []
    # Notices go through logging (the cbbench logger) now; commits before that (6a0ec45,
    # 8169f12) take a `notice` callback as run_http's and run_load's fourth argument.
    old_notice = "notice" in inspect.signature(run_http).parameters
    self0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    pauses = _GcPauses()
    profiler = None
    if spec.get("profile"):  # cProfile around the run (it slows the client: figures read worse)
        import cProfile

        profiler = cProfile.Profile()
    wall0 = time.perf_counter()
    pauses.start()
    if profiler is not None:
        profiler.enable()
    if spec["workers"] > 1:
        from cbbench.distributed.plan import LoadPlan
        from cbbench.distributed.run import run_load

        if "notice" in inspect.signature(run_load).parameters:  # before notices were logged
            run = run_load(opts, wreqs, arrivals, notices.append, LoadPlan(spec["workers"]))
        else:
            run = run_load(opts, wreqs, arrivals, LoadPlan(spec["workers"]))
    else:
        window = _RunWindow()
        if old_notice:
            run = run_http(opts, wreqs, arrivals, notices.append, on_progress=window.progress)
        else:
            run = run_http(opts, wreqs, arrivals, on_progress=window.progress)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(spec["profile"])
    wall = time.perf_counter() - wall0
    pauses.stop()
    self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    cpu = sum(
        (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)
        for a, b in ((self0, self1), (kids0, kids1))
    )
    # The kernel's share and the minor page faults: a client whose reads map fresh memory
    # (read_buffers.py) shows in both before it shows in the CPU total.
    sys_cpu = sum(b.ru_stime - a.ru_stime for a, b in ((self0, self1), (kids0, kids1)))
    minflt = sum(b.ru_minflt - a.ru_minflt for a, b in ((self0, self1), (kids0, kids1)))
    records = [
        {
            "id": r.id,
            "intended": r.intended_start_s,
            "send": r.send_s,
            "first": r.token_times_s[0] if r.token_times_s else None,
            "ok": r.error is None,
            "error_type": r.error_type,
        }
        for r in run.records
    ]
    info = run.info
    out = {
        "records": records,
        "duration_s": run.duration_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "sys_cpu_s": sys_cpu,
        "minor_faults": minflt,
        # One process: its CPU from the first request's end to the last one's (the progress
        # callback, which every commit calls from its event loop), without set-up and the
        # analysis after the run, which differ between commits and are not the send path.
        "window": window.result() if spec["workers"] == 1 else None,
        "notices": notices,
        "loop_lag_p99_ms": info.get("loop_lag_p99_ms"),
        "client_fell_behind": info.get("client_fell_behind"),
        "gc": pauses.result(),
    }
    Path(out_path).write_text(json.dumps(out))


def _run_client(side: Side, spec: dict, work: Path, timeout_s: float) -> dict:
    spec_path, out_path = work / f"{spec['tag']}.spec.json", work / f"{spec['tag']}.out.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [side.python, str(Path(__file__).resolve()), "--client", str(spec_path), str(out_path)],
        cwd=work, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, **dict(side.env)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"the {side.name} client ({side.label}) failed:\n{proc.stderr[-3000:]}")
    out = json.loads(out_path.read_text())
    spec_path.unlink()
    if spec.get("records_dir"):  # each request's times, for a closer look
        out_path.replace(Path(spec["records_dir"]) / out_path.name)
    else:
        out_path.unlink()
    return out


# ---- the figures ------------------------------------------------------------------------------
def _pct(a, p) -> float:
    return float(np.percentile(np.asarray(a, dtype=np.float64), p)) if len(a) else float("nan")


def figures(out: dict, log: dict[str, dict], tag: str, requests: int) -> dict:
    """One run's figures: the client's records held to the server's log."""
    recs = out["records"]
    ok = [r for r in recs if r["ok"] and r["first"] is not None]
    err, ttft, server = [], [], []
    for r in ok:
        entry = log.get(f"{tag}-{r['id']}")
        if entry is None or "first_token" not in entry:
            continue
        s = entry["first_token"] - entry["received"]
        c = r["first"] - r["intended"]  # TTFT as the client reports it: from the intended start
        server.append(s * 1e3)
        ttft.append(c * 1e3)
        err.append((c - s) * 1e3)
    lag = [(r["send"] - r["intended"]) * 1e3 for r in recs if r["send"] is not None]
    sends = [r["send"] for r in recs if r["send"] is not None]
    span = max(sends) - min(sends) if len(sends) > 1 else 0.0
    # A Poisson draw of N arrivals spans N / rate give or take sqrt(N) / rate: over a 4 s run
    # at 1000 req/s the schedule itself runs 1.6% fast or slow. What the client reached is
    # its sends' rate over the rate of the intended starts it was given (the same requests).
    planned = [r["intended"] for r in recs if r["send"] is not None]
    planned_span = max(planned) - min(planned) if len(planned) > 1 else 0.0
    schedule_rate = (len(planned) - 1) / planned_span if planned_span > 0 else 0.0
    return {
        "requests": requests,
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "not_sent": requests - len(recs),
        "joined_to_server_log": len(err),
        "error_types": sorted({r["error_type"] for r in recs if r["error_type"]}),
        "ttft_err_p50_ms": _pct(err, 50),
        "ttft_err_p99_ms": _pct(err, 99),
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p99_ms": _pct(ttft, 99),
        "server_ttft_p50_ms": _pct(server, 50),
        "server_ttft_p99_ms": _pct(server, 99),
        "ttft_p99_over_server_ms": _pct(ttft, 99) - _pct(server, 99),
        "send_lag_p50_ms": _pct(lag, 50),
        "send_lag_p99_ms": _pct(lag, 99),
        "send_lag_max_ms": max(lag) if lag else float("nan"),
        "achieved_send_rate": (len(sends) - 1) / span if span > 0 else 0.0,
        "schedule_rate": schedule_rate,
        "achieved_over_schedule": ((len(sends) - 1) / span / schedule_rate
                                   if span > 0 and schedule_rate > 0 else 0.0),
        "client_cpu_s": out["cpu_s"],
        # Over the run (one process: first to last completion; workers: the whole call).
        "client_cpu_cores": (out["window"]["cpu_s"] / out["window"]["wall_s"])
        if out.get("window") else out["cpu_s"] / out["wall_s"],
        "client_cpu_us_per_request": out["cpu_s"] / max(1, len(recs)) * 1e6,
        # Older result files (before these two were kept) read nan.
        "client_sys_cpu_us_per_request": out.get("sys_cpu_s", float("nan"))
        / max(1, len(recs)) * 1e6,
        "minor_faults_per_request": out.get("minor_faults", float("nan")) / max(1, len(recs)),
        "loop_lag_p99_ms": out["loop_lag_p99_ms"],
        "client_fell_behind": out["client_fell_behind"],
        "gc_collections": out["gc"]["collections"],
        "gc_pause_total_ms": out["gc"]["pause_total_ms"],
        "gc_pause_max_ms": out["gc"]["pause_max_ms"],
        "gc": out["gc"],
    }


def summarize(runs: list[dict], names: list[str]) -> dict:
    """Each side's median over its runs and, for each side but the reference, its ratio to the
    reference: of the medians, and per pair (pair k: the k-th run of each side, run in the
    same round)."""
    by = {name: [r for r in runs if r["side"] == name] for name in names}
    out: dict = {}
    for name in names:
        out[name] = {}
        for key, _ in FIGURES:
            ref = [r[key] for r in by["ref"]]
            mine = [r[key] for r in by[name]]
            fig = {"median": float(np.median(mine))}
            if name != "ref":
                base = float(np.median(ref))
                fig["ratio"] = fig["median"] / base if base else None
                fig["pair_ratios"] = [round(n / f, 3) for f, n in zip(ref, mine) if f]
            out[name][key] = fig
    return out


def table(summary: dict, sides: list[Side]) -> str:
    head = f"| figure | ref {sides[0].label} |"
    rule = "| --- | --- |"
    for side in sides[1:]:
        head += f" {side.name} {side.label} | {side.name}/ref | per round |"
        rule += " --- | --- | --- |"
    lines = [head, rule]
    for key, label in FIGURES:
        row = f"| {label} | {summary['ref'][key]['median']:.3g} |"
        for side in sides[1:]:
            s = summary[side.name][key]
            ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}"
            pairs = ", ".join(f"{p:.2f}" for p in s["pair_ratios"])
            row += f" {s['median']:.3g} | {ratio} | {pairs} |"
        lines.append(row)
    return "\n".join(lines)


def start_sides(against: str | None) -> dict[str, str]:
    """The pythons a start-up benchmark runs side by side: ``against``'s unpacked commit (when
    given) first, then this tree's."""
    sides = {"worktree": sys.executable}
    if against:
        ref = commit_side("ref", against, Path(tempfile.gettempdir()))
        sides = {ref.label: ref.python, **sides}
    return sides


def start_envs(work: Path, uncached: str) -> dict[str, dict[str, str]]:
    """The two ways a process starts: with its bytecode cached (in ``work``, filled first by
    the caller, not counted) and with none written (the ``uncached`` label)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    return {"bytecode cached": {**base, "PYTHONPYCACHEPREFIX": str(work / "cache")},
            uncached: {**base, "PYTHONDONTWRITEBYTECODE": "1"}}


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


# ---- the comparison -------------------------------------------------------------------------------
NICE_ENV = "CBBENCH_BENCH_NICED"


def _own_cpu_share(nice: int) -> None:
    """Run the comparison (its server and clients) in a scheduler group of its own, weighted
    `nice`. Linux with autogroup shares the CPUs between sessions first, so on a machine other
    sessions keep busy a client gets a fraction of a core, whatever its own nice: it falls
    behind at a few hundred requests/s and both sides measure the machine, not the client. A new
    session is a new group; its weight is /proc/self/autogroup (negative values need root)."""
    if os.environ.get(NICE_ENV) is None:  # become a session of our own first (re-exec setsid)
        env = {**os.environ, NICE_ENV: "1"}
        os.execvpe("setsid", ["setsid", "--wait", sys.executable, *sys.argv], env)
    try:
        Path("/proc/self/autogroup").write_text(f"{nice}\n")
    except OSError as e:
        print(f"# --nice {nice}: autogroup not set ({e}); os.nice instead", file=sys.stderr)
        try:
            os.nice(nice)
        except OSError as e2:  # a negative nice needs privileges: run as the shares allow
            print(f"# --nice {nice}: not applied either ({e2})", file=sys.stderr)


def compare(args: argparse.Namespace) -> dict:
    if args.nice is not None:
        _own_cpu_share(args.nice)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
    from timing_server import fetch_cpu, fetch_log, timing_server

    from cbbench.load.arrivals import arrival_times
    from cbbench.load.workload import WorkloadRequest

    base = Path(args.ref_dir or tempfile.gettempdir())
    ref = commit_side("ref", args.against, base)
    revs = args.new or ["worktree"]
    names = ["new"] if len(revs) == 1 else [f"new{i + 1}" for i in range(len(revs))]
    sides = [ref] + [
        side_for(name, rev, base) for name, rev in zip(names, revs)
    ]
    n = args.requests or int(args.rate * args.duration)
    wreqs = [WorkloadRequest(i, PROMPT_LEN, args.tokens) for i in range(n)]
    process = "constant" if args.arrival == "constant" else "gamma"  # gamma shape 1 = Poisson
    arrivals = [float(a) for a in arrival_times(wreqs, args.rate, 1.0, process, args.seed)]
    timeout_s = arrivals[-1] + CLIENT_TIMEOUT_MARGIN_S
    runs: list[dict] = []
    started = _uptime()
    print("# " + ", ".join(f"{x.name} {x.label}" for x in sides) + f"; {started}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="cbbench-bench-") as work, timing_server(
        args.ttft_ms, args.itl_ms
    ) as url:
        fetch_log(url, clear=True)
        for k in range(args.repeats):
            for side in sides if k % 2 == 0 else sides[::-1]:
                tag = f"{side.name}{k}"
                spec = {"url": url, "tag": tag, "tokens": args.tokens, "arrivals": arrivals,
                        "workers": args.workers}
                if args.records_dir:
                    spec["records_dir"] = str(Path(args.records_dir).resolve())
                if args.profile_dir:
                    spec["profile"] = str(Path(args.profile_dir).resolve() / f"{tag}.prof")
                load = os.getloadavg()[0]
                server_cpu0 = fetch_cpu(url)
                out = _run_client(side, spec, Path(work), timeout_s)
                server_cpu = fetch_cpu(url) - server_cpu0
                fig = figures(out, fetch_log(url, clear=True), tag, n)
                # The truth server's own CPU over the client's call, per request: whether it
                # kept up is in the server TTFT figures; this says how close to its edge.
                fig["server_cpu_us_per_request"] = server_cpu / n * 1e6
                fig.update(side=side.name, commit=side.label, repeat=k, loadavg_1min_before=load)
                runs.append(fig)
                print(json.dumps(fig), flush=True)
    summary = summarize(runs, [x.name for x in sides])
    result = {
        "command": " ".join(["python", "tests/bench/bench_loadgen.py", *sys.argv[1:]]),
        "sides": {x.name: x.label for x in sides},
        "rate": args.rate,
        "arrival": args.arrival,
        "requests": n,
        "tokens": args.tokens,
        "server": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms},
        "workers": args.workers,
        "repeats": args.repeats,
        "nice": args.nice,
        "autogroup": Path("/proc/self/autogroup").read_text().strip()
        if Path("/proc/self/autogroup").exists() else None,
        "uptime_before": started,
        "uptime_after": _uptime(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}",
        "summary": summary,
        "runs": runs,
    }
    print(table(summary, sides))
    print(f"# {result['uptime_before']} -> {result['uptime_after']}")
    if args.json_out:
        tmp = Path(args.json_out + ".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(args.json_out)  # atomically: a finished comparison is never half written
    return result


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--against", metavar="REV", help="the reference commit (side by side)")
    ap.add_argument("--new", metavar="REV", action="append",
                    help="compare commit REV ('worktree': this tree); repeat for more sides")
    ap.add_argument("--requests", type=int, default=0, help="default: rate x duration")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved")
    ap.add_argument("--ttft-ms", type=float, default=150.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=4, help="output tokens per request")
    ap.add_argument("--ref-dir", help="where commits are unpacked (default: the temp folder)")
    ap.add_argument("--json-out", help="also write the whole comparison here (JSON)")
    ap.add_argument("--nice", type=int, help="run in a scheduler group of its own, this weight")
    ap.add_argument("--records-dir", help="keep each run's per-request times in DIR")
    ap.add_argument("--profile-dir", help="cProfile each client run into DIR/<side><k>.prof")


if __name__ == "__main__":  # the client side: python bench_loadgen_ab.py --client SPEC OUT
    if len(sys.argv) == 4 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("run it through tests/bench/bench_loadgen.py --against REV")
