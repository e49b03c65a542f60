"""The latency-throughput curve of one or more sweeps (sweep.json), as a matplotlib Figure.

Object-oriented API only (`matplotlib.figure.Figure`, never pyplot), as in plots.py: no GUI
backend, no global figure registry.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from cbbench.errors import UsageError
from cbbench.finite import is_finite
from cbbench.schema import read_json_file, read_sweep
from cbbench.schema.points import ProbePoint, points_of, rate_label
from cbbench.schema.sweep import SWEEP_KIND, SweepFile

WIDTH_IN = 9.0
HEIGHT_IN = 7.0
DPI = 100
LOG_SPAN = 100.0  # log y axis when a panel's values span at least this ratio
PANELS = (("TTFT p99 (ms)", "ttft_p99_ms", "ttft"), ("TPOT p99 (ms)", "tpot_p99_ms", "tpot"))
COLOR_SLO = "#d64541"


def is_sweep(data: object) -> bool:
    match data:
        case {"kind": kind}:
            return kind == SWEEP_KIND
    return False


def is_sweep_file(path: Path) -> bool:
    """True for a sweep.json (cheap enough to call on every file `report` is given)."""
    try:
        return is_sweep(read_json_file(path))
    except UsageError:  # the run reader says what is wrong with it
        return False


def load_sweep(path: Path) -> SweepFile:
    """A sweep.json as its model (cbbench/schema/sweep.py, which refuses a field of the wrong
    kind), then the plot's own rules: a positive rate, finite figures and SLO limits."""
    sweep = read_sweep(path)
    _check_plotted_fields(path, sweep)
    return sweep


def _check_plotted_fields(path: Path, sweep: SweepFile) -> None:
    """What the schema lets through and the plot cannot draw: a rate of 0 or below, a NaN
    figure or SLO limit (a sweep.json whose points were text, null or held a text rate was a
    TypeError / ValueError / AttributeError traceback; the schema refuses those now)."""

    def bad(what: str) -> UsageError:
        return UsageError(f"{path}: {what}: cannot plot it")

    for i, p in enumerate(sweep.points):
        # A text rate is "inf" (the schema's Literal); a number must be finite and above 0.
        if not isinstance(p.rate, str) and not (is_finite(p.rate) and p.rate > 0):
            raise bad(f"point {i} has rate {p.rate!r}")
        for key, v in (("output_throughput", p.output_throughput),
                       ("ttft_p99_ms", p.ttft_p99_ms), ("tpot_p99_ms", p.tpot_p99_ms)):
            if v is not None and not is_finite(v):
                raise bad(f"point {i} has {key} {v!r}")
    slo = sweep.slo
    if slo is not None and not all(is_finite(v) for v in slo.limits_ms.values()):
        raise bad(f"'slo' is {slo.model_dump(exclude_unset=True)!r}")


def _draw_series(ax, points: list[ProbePoint], key: str, color: str, label: str) -> None:
    """The finite rates as a line in rate order; rate inf (a burst, whose throughput the
    drain tail lowers) as a lone square beside it."""
    pts = sorted((p for p in points if getattr(p, key) is not None), key=lambda p: p.rate)
    line = [p for p in pts if not math.isinf(p.rate)]
    if line:
        ax.plot([p.output_throughput for p in line], [getattr(p, key) for p in line], "-",
                color=color, alpha=0.6, label=label)
    for i, p in enumerate(pts):
        x, y = p.output_throughput, getattr(p, key)
        marker = "s" if math.isinf(p.rate) else "o"
        face = "white" if p.steady is False else color
        ax.plot([x], [y], marker, color=color, markerfacecolor=face,
                label=label if not line and i == 0 else None)
        ax.annotate(rate_label(p.rate), (x, y), textcoords="offset points", xytext=(4, 4),
                    fontsize=7, color=color)


def latency_throughput(sweeps: Sequence[tuple[str, SweepFile]]) -> Figure:
    """TTFT p99 and TPOT p99 against achieved output throughput, one line per sweep; each
    point is labelled with its offered rate. Hollow markers: runs that never reached a
    steady state; squares: rate inf. Dashed lines: the sweep's SLO limits."""
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    fig.suptitle("Latency vs throughput")
    for ax, (title, key, slo_key) in zip(axes, PANELS):
        values = []
        # limit -> the sweeps that set it: one line each, however many share it
        limits: dict[float, list[str]] = {}
        for i, (label, sweep) in enumerate(sweeps):
            pts = points_of(sweep)
            _draw_series(ax, pts, key, f"C{i % 10}", label)
            values += [getattr(p, key) for p in pts if getattr(p, key)]
            limit = sweep.slo.limits_ms.get(slo_key) if sweep.slo else None
            if limit is not None:
                limits.setdefault(limit, []).append(label)
        for limit, labels in limits.items():
            who = "" if len(labels) == len(sweeps) else f" ({', '.join(labels)})"
            ax.axhline(limit, color=COLOR_SLO, linestyle="--", linewidth=1,
                       label=f"SLO {slo_key} {limit:g} ms{who}")
        if values and max(values) / max(min(values), 1e-9) >= LOG_SPAN:
            ax.set_yscale("log")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("achieved output throughput (tok/s)")
    axes[0].set_title(
        "labels: offered rate (req/s); hollow: never reached a steady state; square: rate inf",
        fontsize=8,
    )
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()
