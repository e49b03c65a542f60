"""The report's figures, one function per plot, each returning a matplotlib Figure.

Figures are built with the object-oriented API (`matplotlib.figure.Figure`), never pyplot:
no GUI backend is ever selected, PNGs render through Agg on a headless machine, and no
global figure registry grows while a report is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from matplotlib.artist import Artist
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from cbbench.analysis.comparison.compare import Labeled
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Request, RunResult

MS = 1000.0
GB = 1e9
WIDTH_IN = 11.0
ROW_HEIGHT_IN = 3.2
# Use a log x axis for a CDF whose values span at least this ratio (tails become readable).
LOG_SPAN = 100.0
PERCENTILE_GUIDES = (0.5, 0.99)
CDF_MAX_POINTS = 2000
GANTT_MAX_REQUESTS = 100
GANTT_ROW_IN = 0.06  # figure height per drawn request row

COLOR_PREFILL = "#e6862a"
COLOR_DECODE = "#3b73b9"
COLOR_QUEUE = "#b9b9b9"
COLOR_ADMITTED = "#9cc3e6"
COLOR_IDLE_WAITING = "#d64541"
COLOR_IDLE = "#eeeeee"
COLOR_RUNNING = "#2e8b57"
COLOR_WAITING = "#8e44ad"
COLOR_MEASURED = "#d64541"

LATENCY_PANELS = (
    ("TTFT", "ttft_ms"),
    ("TPOT", "tpot_ms"),
    ("ITL", "itl_ms"),
    ("E2EL", "e2el_ms"),
)


# ---- data access --------------------------------------------------------------------------


def _column(values: Iterable[float | None], default: float = 0.0) -> np.ndarray:
    return np.array([default if v is None else v for v in values], dtype=np.float64)


# The per-request latencies a CDF panel reads, by the summary's key.
REQUEST_LATENCY: dict[str, Callable[[Request], float | None]] = {
    "ttft_ms": lambda r: r.ttft_ms,
    "tpot_ms": lambda r: r.tpot_ms,
    "e2el_ms": lambda r: r.e2el_ms,
}


def request_values(result: RunResult | dict, key: str) -> np.ndarray:
    """Per-request values of ttft_ms, tpot_ms or e2el_ms (completed requests only)."""
    value = REQUEST_LATENCY[key]
    return np.array(
        [v for r in as_run(result).requests or [] if _completed(r) and (v := value(r)) is not None],
        dtype=np.float64,
    )


def _completed(r: Request) -> bool:
    """The requests the summary's latencies count (analysis/summary/percentiles.py): neither
    failed nor cancelled; a cancelled request's gaps drew the ITL CDF's tail off the table's."""
    return r.error is None and not r.cancelled


def itl_values(result: RunResult | dict) -> np.ndarray | None:
    """Pooled inter-token gaps in ms, from itl_ms or token_times_s lists (--save-detailed);
    None when the result kept neither."""
    gaps = []
    found = False
    for r in as_run(result).requests or []:
        if not _completed(r):
            continue
        if r.itl_ms is not None:
            found = True
            gaps.append(np.asarray(r.itl_ms, dtype=np.float64))
        elif r.token_times_s is not None:
            found = True
            gaps.append(np.diff(np.asarray(r.token_times_s, dtype=np.float64)) * MS)
    if not found:
        return None
    return np.concatenate(gaps) if gaps else np.zeros(0)


def latency_values(result: RunResult | dict, key: str) -> np.ndarray | None:
    return itl_values(result) if key == "itl_ms" else request_values(result, key)


def peak_bw_gbps(result: RunResult | dict) -> float | None:
    spec = as_run(result).config.gpu_spec or {}
    bw = spec.get("hbm_bandwidth")  # a GpuSpec's dict (engine/sim/gpu_specs.py)
    return float(bw) / GB if bw else None


# The telemetry section's "source" (analysis/summary/telemetry.py SOURCE; DCGM beside NVML) as the
# plots name it; an unknown source is shown upper-cased.
TELEMETRY_SOURCE_NAMES = {"nvml": "NVML", "dcgm": "DCGM"}


def runs_on_cpu(result: RunResult | dict) -> bool:
    """A torch run on the CPU: its memory is the host's DRAM, not a GPU's HBM."""
    c = as_run(result).config
    return str(c.device or c.device_name or "").startswith("cpu")


def memory_name(result: RunResult | dict) -> str:
    return "CPU memory" if runs_on_cpu(result) else "HBM"


def bandwidth_title(results: Sequence[Labeled]) -> str:
    """HBM bandwidth, unless a run is on the CPU (its bandwidth is the host memory's)."""
    names = {memory_name(x.result) for x in results}
    return f"{names.pop()} bandwidth" if len(names) == 1 else "Memory bandwidth (HBM, CPU memory)"


def measured_label(result: RunResult | dict) -> str:
    """The measured line's name, from the telemetry that measured it."""
    tel = as_run(result).telemetry
    source = str((tel.source if tel is not None else None) or "nvml")
    return f"measured ({TELEMETRY_SOURCE_NAMES.get(source, source.upper())})"


def _bandwidth_samples(result: RunResult | dict) -> list[tuple[str, str, float, float]]:
    """(host, GPU, t_s, DRAM bandwidth %) of each telemetry sample that measured DRAM
    bandwidth (none without telemetry); host and GPU "" where the sample names none."""
    tel = as_run(result).telemetry
    if tel is None or not tel.available:
        return []
    # A drawn sample has its time (report/check.py refuses one without it before this).
    return [(str(s.hostname or ""), "" if s.gpu is None else str(s.gpu), s.t_s,
             s.dram_bw_util_pct)
            for s in tel.samples or [] if s.dram_bw_util_pct is not None and s.t_s is not None]


def telemetry_bandwidth(result: RunResult | dict) -> tuple[np.ndarray, np.ndarray] | None:
    pts = [(t, pct) for _, _, t, pct in _bandwidth_samples(result)]
    if not pts:
        return None
    t, pct = np.array(pts, dtype=np.float64).T
    return t, pct


def telemetry_bandwidth_by_gpu(result: RunResult | dict
                               ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The measured bandwidth as one series per GPU ((host, gpu) of each sample): pooled,
    two GPUs' samples interleave and one line zig-zags between them. Each series is named
    by its GPU ("" when the run read one GPU)."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for host, gpu, t, pct in _bandwidth_samples(result):
        series.setdefault((host, gpu), []).append((t, pct))
    out = []
    for (host, gpu), pts in sorted(series.items()):
        name = "" if len(series) == 1 else (f"{host} GPU {gpu}" if host else f"GPU {gpu}")
        t, pct = np.array(sorted(pts), dtype=np.float64).T
        out.append((name, t, pct))
    return out


def _rows_figure(n: int, title: str, sharex: bool = False) -> tuple[Figure, list]:
    fig = Figure(figsize=(WIDTH_IN, ROW_HEIGHT_IN * n + 0.6), layout="constrained")
    axes = fig.subplots(n, 1, squeeze=False, sharex=sharex)[:, 0]
    fig.suptitle(title)
    return fig, list(axes)


def _color(i: int) -> str:
    """The i-th result's colour, the same in every overlay plot (a result missing from one
    panel must not shift the others' colours)."""
    return f"C{i % 10}"


def _cdf_points(n: int) -> np.ndarray:
    """Indices of at most CDF_MAX_POINTS evenly spaced order statistics, both ends included:
    a pooled ITL list has one gap per token, far more than a plot can show."""
    if n <= CDF_MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, CDF_MAX_POINTS).round().astype(int))


def _bars(ax, y: np.ndarray, left: np.ndarray, width: np.ndarray, color: str, label: str,
          height: float = 0.8) -> None:
    """Horizontal bars as one PolyCollection: one artist for all rows instead of a
    Rectangle each, which keeps a timeline of hundreds of spans quick to draw."""
    h = height / 2
    verts = [
        [(x0, yy - h), (x0 + w, yy - h), (x0 + w, yy + h), (x0, yy + h)]
        for yy, x0, w in zip(y, left, width)
    ]
    ax.add_collection(PolyCollection(verts, facecolors=color, linewidths=0, label=label))


def _figure_legend(fig: Figure, axes: Iterable) -> None:
    """One legend below the panels for every series drawn in any of them (rows of the same
    kind share it), so no legend hides data."""
    seen: dict[str, Artist] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center",
                   ncols=min(len(seen), 5), fontsize="small", frameon=False)


def _stack(ax, x: np.ndarray, layers: Sequence[tuple[np.ndarray, str, str]]) -> None:
    """Stacked step areas, one per (values, label, color)."""
    bottom = np.zeros_like(x, dtype=np.float64)
    for values, label, color in layers:
        top = bottom + values
        ax.fill_between(x, bottom, top, step="post", label=label, color=color, linewidth=0)
        bottom = top


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


# ---- the plots ----------------------------------------------------------------------------


def latency_cdfs(results: Sequence[Labeled]) -> Figure:
    """TTFT, TPOT, ITL and E2EL CDFs, one line per result. A result without per-token times
    has no ITL line (the panel says so)."""
    fig = Figure(figsize=(WIDTH_IN, 7.5), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    fig.suptitle("Latency CDFs (from each request's intended start)")
    for ax, (name, key) in zip(axes, LATENCY_PANELS):
        missing = []
        lows, highs = [], []
        for i, x in enumerate(results):
            v = latency_values(x.result, key)
            if v is None or v.size == 0:
                missing.append(x.label)
                continue
            v = np.sort(v)
            frac = np.arange(1, v.size + 1) / v.size
            keep = _cdf_points(v.size)
            ax.step(v[keep], frac[keep], where="post", label=x.label, color=_color(i))
            lows.append(v[v > 0].min() if (v > 0).any() else 0.0)
            highs.append(v.max())
        if not lows:
            _no_data(ax, f"no {name} data" + (" (needs --save-detailed)" if key == "itl_ms" else ""))
            ax.set_title(name)
            continue
        if min(lows) > 0 and max(highs) / min(lows) >= LOG_SPAN:
            ax.set_xscale("log")
        for q in PERCENTILE_GUIDES:
            ax.axhline(q, color="0.7", linestyle=":", linewidth=0.8)
        ax.set_ylim(0, 1.01)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of " + ("token gaps" if key == "itl_ms" else "requests"))
        title = name + (f" (no data: {', '.join(missing)})" if missing else "")
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
    return fig


def token_budget_timeline(results: Sequence[Labeled]) -> Figure:
    """Prefill and decode tokens stacked per iteration under the token budget; running and
    waiting request counts on the right axis."""
    fig, axes = _rows_figure(len(results), "Token budget per iteration")
    drawn = []
    for ax, x in zip(axes, results):
        its = as_run(x.result).iterations or []
        ax.set_title(x.label, fontsize="medium", loc="left")
        if not its:
            _no_data(ax, "no iteration records")
            continue
        idx = _column(it.index for it in its)
        _stack(ax, idx, [
            (_column(it.num_prefill_tokens for it in its), "prefill tokens", COLOR_PREFILL),
            (_column(it.num_decode_tokens for it in its), "decode tokens", COLOR_DECODE),
        ])
        ax.step(idx, _column(it.token_budget for it in its), where="post", color="k",
                linewidth=1, label="token budget")
        ax.set_xlabel("iteration")
        ax.set_ylabel("tokens")
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.step(idx, _column(it.num_running for it in its), where="post", color=COLOR_RUNNING,
                 linewidth=0.9, label="running")
        ax2.step(idx, _column(it.num_waiting for it in its), where="post", color=COLOR_WAITING,
                 linewidth=0.9, label="waiting")
        ax2.set_ylabel("requests")
        ax2.set_ylim(bottom=0)
        drawn += [ax, ax2]
    _figure_legend(fig, drawn)
    return fig


def batch_occupancy(results: Sequence[Labeled]) -> Figure:
    """Sequence slots per iteration, up to max_num_seqs: requests computed this iteration,
    admitted but not computed, and idle slots split by whether requests were waiting (the
    red area is capacity wasted while work queued: static batching's cost)."""
    fig, axes = _rows_figure(len(results), "Batch occupancy (sequence slots per iteration)")
    for ax, x in zip(axes, results):
        run = as_run(x.result)
        its = run.iterations or []
        if not its:
            ax.set_title(x.label, fontsize="medium", loc="left")
            _no_data(ax, "no iteration records")
            continue
        slots = run.config.max_num_seqs
        idx = _column(it.index for it in its)
        active = (_column(it.num_prefill_reqs for it in its)
                  + _column(it.num_decode_reqs for it in its))
        running = np.maximum(_column(it.num_running for it in its), active)
        waiting = _column(it.num_waiting for it in its)
        cap = float(slots) if slots else float(running.max())
        idle = np.maximum(cap - running, 0.0)
        idle_waiting = np.minimum(idle, waiting)
        _stack(ax, idx, [
            (active, "computed this iteration", COLOR_DECODE),
            (running - active, "admitted, not computed", COLOR_ADMITTED),
            (idle_waiting, "idle while requests waited", COLOR_IDLE_WAITING),
            (idle - idle_waiting, "idle, queue empty", COLOR_IDLE),
        ])
        ax.set_ylim(0, cap * 1.02)
        ax.set_xlabel("iteration")
        ax.set_ylabel(f"slots (max_num_seqs={slots})" if slots else "slots")
        wasted = idle_waiting.sum() / (cap * len(its)) if cap else 0.0
        ax.set_title(
            f"{x.label}: {active.mean() / cap:.0%} of slots computing on average; "
            f"{wasted:.0%} idle while requests waited",
            fontsize="medium", loc="left",
        )
    _figure_legend(fig, axes)
    return fig


def kv_usage(results: Sequence[Labeled]) -> Figure:
    """KV blocks in use over time (share of the pool), preemptions marked."""
    fig = Figure(figsize=(WIDTH_IN, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.set_title("KV cache blocks in use")
    drawn = False
    for i, x in enumerate(results):
        its = as_run(x.result).iterations or []
        if not its:
            continue
        t = _column(it.start_s for it in its)
        total = _column((it.kv_blocks_total for it in its), default=np.nan)
        used = _column(it.kv_blocks_used for it in its) / total * 100
        ax.step(t, used, where="post", color=_color(i),
                label=f"{x.label} ({int(np.nanmax(total)):,} blocks)")
        preempted = _column(it.num_preempted for it in its)
        pre = preempted > 0
        if pre.any():
            n = int(preempted.sum())
            ax.scatter(t[pre], used[pre], marker="x", s=30, color=_color(i),
                       label=f"{x.label}: preemptions ({n})", zorder=3)
        drawn = True
    if not drawn:
        _no_data(ax, "no iteration records")
        return fig
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV blocks used (% of pool)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def bandwidth_timeline(results: Sequence[Labeled]) -> Figure:
    """Analytic memory bandwidth per iteration (bytes the model says moved / iteration time),
    and the bandwidth GPU telemetry measured (dram_bw_util_pct) where the result has it; named
    HBM on a GPU, CPU memory on the CPU, the measured line by its source (NVML, DCGM)."""
    fig, axes = _rows_figure(len(results), f"{bandwidth_title(results)} over time", sharex=True)
    drawn = []
    for ax, x in zip(axes, results):
        run = as_run(x.result)
        its = run.iterations or []
        ax.set_title(f"{x.label} ({memory_name(run)})", fontsize="medium", loc="left")
        peak = peak_bw_gbps(run)
        measured = telemetry_bandwidth_by_gpu(run)
        if not its and not measured:
            _no_data(ax, "no iteration records or telemetry")
            continue
        if its:
            ax.step(_column(it.start_s for it in its), _column(it.achieved_bw_gbps for it in its),
                    where="post", color=COLOR_DECODE, linewidth=0.8,
                    label="analytic (per iteration)")
        target = ax
        if measured and not peak:
            target = ax.twinx()
            target.set_ylabel("measured DRAM bandwidth (% of peak)")
            target.set_ylim(0, 100)
        for k, (gpu, t, pct) in enumerate(measured):
            # The first GPU in the measured colour, the others in dashes of their own.
            style = {"color": COLOR_MEASURED} if k == 0 else {"color": _color(k + 1),
                                                               "linestyle": "--"}
            label = measured_label(run) + (f" {gpu}" if gpu else "")
            target.plot(t, pct * peak / 100 if peak else pct, linewidth=1.2, label=label,
                        **style)
        if peak:
            ax.axhline(peak, color="k", linestyle="--", linewidth=0.8,
                       label=f"peak {peak:,.0f} GB/s")
            ax.set_ylim(0, peak * 1.08)
            sec = ax.secondary_yaxis(
                "right", functions=(lambda g, p=peak: g / p * 100, lambda q, p=peak: q * p / 100)
            )
            sec.set_ylabel("% of peak")
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel("GB/s")
        drawn += [ax, target]
    axes[-1].set_xlabel("time (s)")
    _figure_legend(fig, drawn)
    return fig


def _start(r: Request) -> float:
    """The request's intended start: every request a report draws has one (report/check.py)."""
    assert r.intended_start_s is not None, "report/check.py requires intended_start_s"
    return r.intended_start_s


def _service_start(r: Request) -> float:
    queue = r.queue_ms
    return _start(r) + (queue / MS if queue is not None else 0.0)


def gantt_rows(reference: RunResult | dict,
               max_requests: int = GANTT_MAX_REQUESTS) -> list[int | str]:
    """Request ids to draw: evenly spread over the reference run's service order, so a
    later static batch shows up even when the first one alone exceeds the cap."""
    reqs = sorted(
        as_run(reference).requests or [],
        key=lambda r: (_start(r), _service_start(r), r.id),
    )
    if len(reqs) <= max_requests:
        return [r.id for r in reqs]
    picks = np.linspace(0, len(reqs) - 1, max_requests).round().astype(int)
    return [reqs[i].id for i in picks]


def request_gantt(pair: Sequence[Labeled], max_requests: int = GANTT_MAX_REQUESTS) -> Figure:
    """Each request's queue, prefill (admission to first token) and decode spans, the same
    requests in the same rows for each run of the pair (e.g. static vs continuous)."""
    ids = gantt_rows(pair[0].result, max_requests)
    total = len(as_run(pair[0].result).requests or [])
    fig = Figure(figsize=(WIDTH_IN, 1.5 + GANTT_ROW_IN * len(ids) * len(pair)), layout="constrained")
    axes = fig.subplots(len(pair), 1, sharex=True, squeeze=False)[:, 0]
    shown = f"all {total}" if len(ids) == total else f"{len(ids)} of {total} (evenly sampled)"
    fig.suptitle(f"Request timeline: {shown} requests")
    row_of = {rid: i for i, rid in enumerate(ids)}
    t_max = 0.0
    for ax, x in zip(axes, pair):
        run = as_run(x.result)
        reqs = [r for r in run.requests or [] if r.id in row_of]
        y = np.array([row_of[r.id] for r in reqs], dtype=np.float64)
        start = np.array([_start(r) for r in reqs], dtype=np.float64)
        service = np.array([_service_start(r) for r in reqs], dtype=np.float64)
        ok = np.array([r.ttft_ms is not None for r in reqs], dtype=bool)
        first = np.array([_start(r) + (r.ttft_ms or 0) / MS for r in reqs])
        last = np.array([_start(r) + (r.e2el_ms or 0) / MS for r in reqs])
        _bars(ax, y, start, service - start, COLOR_QUEUE, "queued")
        _bars(ax, y[ok], service[ok], (first - service)[ok], COLOR_PREFILL,
              "prefill (admitted → first token)")
        _bars(ax, y[ok], first[ok], (last - first)[ok], COLOR_DECODE, "decode")
        if (~ok).any():
            ax.scatter(start[~ok], y[~ok], marker="x", color=COLOR_IDLE_WAITING, label="failed")
        if reqs:
            t_max = max(t_max, float(np.concatenate([start, last[ok]]).max()))
        ax.set_ylim(len(ids) - 0.5, -0.5)  # first request at the top
        ax.set_yticks([])
        ax.set_ylabel("requests")
        sched = run.config.scheduler
        ax.set_title(f"{x.label} ({sched})" if sched else x.label, fontsize="medium", loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlim(0, t_max * 1.02 or 1.0)  # shared; collections do not autoscale
    axes[-1].set_xlabel("time (s)")
    _figure_legend(fig, axes)
    return fig
