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
from cbbench.schema import read_json_file, read_sweep_dict
from cbbench.schema.points import ProbePoint, points_of, rate_label
from cbbench.schema.sweep import SWEEP_KIND

WIDTH_IN = 9.0
HEIGHT_IN = 7.0
DPI = 100
LOG_SPAN = 100.0  # log y axis when a panel's values span at least this ratio
PANELS = (("TTFT p99 (ms)", "ttft_p99_ms", "ttft"), ("TPOT p99 (ms)", "tpot_p99_ms", "tpot"))
COLOR_SLO = "#d64541"


def is_sweep(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == SWEEP_KIND


def is_sweep_file(path: Path) -> bool:
    """True for a sweep.json (cheap enough to call on every file `report` is given)."""
    try:
        return is_sweep(read_json_file(path))
    except UsageError:  # load_result says what is wrong with it
        return False


def load_sweep(path: Path) -> dict:
    """A sweep.json, validated by its schema (cbbench/schema/sweep.py), then the plot's own
    rules: a positive rate, an SLO of numbers."""
    data = read_sweep_dict(path)
    _check_plotted_fields(path, data)
    return data


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_plotted_fields(path: Path, data: dict) -> None:
    """Every field the plot reads has its kind: a sweep.json whose points were text, null or
    held a text rate was a TypeError / ValueError / AttributeError traceback."""

    def bad(what: str) -> UsageError:
        return UsageError(f"{path}: {what}: cannot plot it")

    points = data.get("points")
    if not isinstance(points, list):
        raise bad(f"'points' is a {type(points).__name__}, not a list of points")
    for i, p in enumerate(points):
        if not isinstance(p, dict):
            raise bad(f"point {i} is a {type(p).__name__}, not an object")
        if p.get("rate") != "inf" and not (_is_number(p.get("rate")) and p["rate"] > 0):
            raise bad(f"point {i} has rate {p.get('rate')!r}")
        for key in ("output_throughput", "ttft_p99_ms", "tpot_p99_ms"):
            if p.get(key) is not None and not _is_number(p[key]):
                raise bad(f"point {i} has {key} {p[key]!r}")
    slo = data.get("slo")
    limits = slo.get("limits_ms") if isinstance(slo, dict) else None
    if (slo is not None and not isinstance(slo, dict)) or (
        limits is not None
        and (not isinstance(limits, dict) or not all(_is_number(v) for v in limits.values()))
    ):
        raise bad(f"'slo' is {slo!r}")


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


def latency_throughput(sweeps: Sequence[tuple[str, dict]]) -> Figure:
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
            limit = ((sweep.get("slo") or {}).get("limits_ms") or {}).get(slo_key)
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
