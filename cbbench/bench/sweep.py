"""Sweeps: one workload at a list of request rates, each point a fresh run, summarized into
sweep.json and a table. Each point draws its own prompts (its own seed: no point meets an
earlier one's prompts in a server's prefix cache) unless --reuse-prompts asks for the same
requests at every rate, and with --reset-prefix-cache empties the server's cache first
(bench/point_prep.py).

`--rates auto`: a rate-inf probe first measures the saturation rate (probe.saturation_rate),
then `points` rates are spread evenly from AUTO_LOW_FRACTION to AUTO_HIGH_FRACTION of it.
After GuideLLM's sweep, not the same: GuideLLM runs a synchronous and a throughput benchmark
and spaces its rates evenly from the synchronous rate up to the throughput rate itself
(profiles/sweep.py: linspace(sync, throughput, sweep_size - 1)[1:]).
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tabulate import tabulate

from cbbench.analysis.summary.slo import AttainmentSLO
from cbbench.bench.point_prep import PointPrep
from cbbench.bench.probe import (
    ProbePoint,
    ProbeSizing,
    rate_label,
    round_rate,
    run_probe,
    saturation_lower_bound,
    saturation_rate,
    summarize_probe,
)
from cbbench.errors import UsageError
from cbbench.schema import RunResult, file_text, from_built, to_dict
from cbbench.schema.points import points_of  # noqa: F401 (re-exported)
from cbbench.schema.run import Telemetry
from cbbench.schema.sweep import SWEEP_KIND, SWEEP_SCHEMA_VERSION, SweepFile, SweepPoint

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
PLOT_FILE = "latency_throughput.png"
POINT_FILES = "rate-*.json"  # point_file's names, as a shell pattern
AUTO = "auto"
AUTO_LOW_FRACTION = 0.10
AUTO_HIGH_FRACTION = 0.95
MISSING = "-"


def parse_rates(text: str) -> list[float] | None:
    """'1,2,4,inf' -> [1.0, 2.0, 4.0, inf]; 'auto' -> None."""
    from cbbench.load.arrivals import parse_rate

    if text.strip().lower() == AUTO:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UsageError("--rates needs a comma-separated list of rates (or 'auto'), e.g. 1,2,4,inf")
    rates = [parse_rate(p) for p in parts]
    labels = [rate_label(r) for r in rates]
    if len(set(labels)) != len(labels):
        raise UsageError(f"--rates lists a rate twice: {text!r}")
    return rates


def point_file(rate: float) -> str:
    """The file name of a point's full result in the sweep's folder."""
    return f"rate-{rate_label(rate)}.json"


def check_no_folder_at(folder: Path, names: Sequence[str], what: str, flag: str) -> None:
    """Refuse, before anything runs, a folder (or a link to one) in ``folder`` standing where
    one of ``names`` (shell patterns where the names depend on what is measured) is written:
    found only when that point's result was written, it failed the command after the point
    was measured, its result lost (and a sweep's file left saying it was not interrupted)."""
    import fnmatch

    if not folder.is_dir():
        return  # created by the command: nothing stands in it yet
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and any(fnmatch.fnmatch(entry.name, n) for n in names):
            raise UsageError(f"{flag} {folder}: {entry.name} is a folder, where {what} is "
                             "written: move it away or give another folder")


def auto_rates(saturation: float, points: int) -> list[float]:
    if points < 1:
        raise UsageError(f"--points must be >= 1, got {points}")
    if not (saturation > 0 and math.isfinite(saturation)):
        raise UsageError(
            f"the rate-inf probe measured no throughput ({saturation}); give --rates explicitly"
        )
    fracs = (
        [AUTO_HIGH_FRACTION]
        if points == 1
        else np.linspace(AUTO_LOW_FRACTION, AUTO_HIGH_FRACTION, points)
    )
    return [round_rate(saturation * f) for f in fracs]


def run_sweep(
    base,
    rates: list[float] | None,
    points: int,
    sizing: ProbeSizing,
    slo: AttainmentSLO | None,
    out_dir: Path,
    should_stop: Callable[[], bool] | None = None,
    prep: PointPrep | None = None,
) -> SweepFile:
    """Run every point (rates None: auto), saving DIR/rate-<r>.json as each finishes and
    DIR/sweep.json after each point, so an interrupted sweep keeps what it measured. Once
    ``should_stop`` is set no further point starts; the one in progress stops its dispatch
    and is saved marked interrupted, and so is the sweep."""
    stop = should_stop or (lambda: False)
    from cbbench.analysis.result import write_atomic_group

    # The file's keys in the file's order: the model dumps them as given.
    sweep = from_built(SweepFile, {
        "kind": SWEEP_KIND,
        "schema_version": SWEEP_SCHEMA_VERSION,
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "rates": AUTO if rates is None else [rate_label(r) for r in rates],
        "sizing": sizing.to_dict(),
        "points_prep": (prep or PointPrep(reuse_prompts=True)).to_dict(),
        "slo": slo.to_dict() if slo is not None else None,
        "saturation_rate": None,
        "config": None,
        "command": None,
        "points": [],
        "interrupted": False,
    }, "the sweep")

    def run_point(rate: float, i: int, total: int | str) -> RunResult:
        log.info(f"rate {rate_label(rate)} ({i}/{total}): {sizing.requests_for(rate)} requests")
        result = run_probe(base, rate, sizing, slo, should_stop, prep)
        path = out_dir / point_file(rate)
        sweep.points.append(sweep_point(rate, result, slo, path.name))
        sweep.interrupted = stop()
        if sweep.config is None:
            sweep.config = shared_config(to_dict(result.config))
            sweep.command = result.config.command
        # Together: a second Ctrl-C between them left a point no sweep.json listed.
        write_atomic_group({path: file_text(result), out_dir / SWEEP_FILE: file_text(sweep)})
        return result

    if rates is None:
        total = points + 1
        result = run_point(math.inf, 1, total)
        if stop():
            return sweep
        saturation = saturation_rate(result)
        sweep.saturation_rate = saturation
        log.info(f"saturation: ~{saturation:.4g} req/s")
        short = saturation_lower_bound(result)
        if short is not None:  # the auto rates sit low by as much
            log.warning(f"warning: {short}")
        rates = auto_rates(saturation, points)
        first = 2
    else:
        first, total = 1, len(rates)
    for i, rate in enumerate(rates, first):
        if stop():
            break
        run_point(rate, i, total)
    return sweep


def sweep_point(rate: float, result: RunResult, slo: AttainmentSLO | None,
                file: str) -> SweepPoint:
    """sweep.json's row of one point: the probe's figures, its seed, what its preparation
    answered, its GPU telemetry's means, whether it was cut short."""
    point = summarize_probe(rate, result, slo, file).to_dict()
    point.update(seed=result.config.seed)
    if result.prefix_cache_reset is not None:
        point.update(prefix_cache_reset=result.prefix_cache_reset)
    if result.warmup_requests is not None:
        point.update(warmup_requests=result.warmup_requests)
    gpu = telemetry_means(result.telemetry)
    if gpu is not None:
        point.update(telemetry=gpu)
    if result.interrupted:
        point.update(interrupted=True)
    return from_built(SweepPoint, point, f"the sweep's point at rate {rate_label(rate)}")


def telemetry_means(tel: Telemetry | None) -> dict | None:
    """A point's GPU telemetry in sweep.json: each quantity's steady-state mean (NVML or a
    DCGM exporter's, pooled over GPUs as the run's summary line is); None without any."""
    if tel is None or not tel.available:
        return None
    steady = tel.summary.steady if tel.summary is not None else None  # a TelemetrySummary
    written = steady.model_dump(exclude_unset=True) if steady is not None else {}
    means = {k: v.get("mean") for k, v in written.items()}
    return {"source": tel.source, "metric": tel.metric, "steady_mean": means}


def shared_config(config: dict) -> dict:
    """The first point's config without what changes per point."""
    per_point = {"request_rate", "num_requests", "command", "label", "seed"}
    return {k: v for k, v in config.items() if k not in per_point}


# ---- the table ------------------------------------------------------------------------------


def cell(v: float | None, digits: int = 1) -> str:
    return MISSING if v is None else f"{v:,.{digits}f}"


def sweep_table(points: Sequence[ProbePoint], tablefmt: str = "simple") -> str:
    with_slo = any(p.slo_attainment is not None for p in points)
    head = ["rate (req/s)", "n", "achieved (req/s)", "output (tok/s)",
            "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2EL p50", "E2EL p99"]
    if with_slo:
        head += ["goodput (req/s)", "SLO att."]
    head.append("steady")
    rows = []
    for p in points:
        n = str(p.num_requests) + (f" ({p.failed} failed)" if p.failed else "")
        row = [rate_label(p.rate), n, cell(p.achieved_request_rate, 2),
               cell(p.output_throughput), cell(p.ttft_p50_ms), cell(p.ttft_p99_ms),
               cell(p.tpot_p50_ms), cell(p.tpot_p99_ms), cell(p.e2el_p50_ms),
               cell(p.e2el_p99_ms)]
        if with_slo:
            att = MISSING if p.slo_attainment is None else f"{p.slo_attainment:.1%}"
            row += [cell(p.goodput, 2), att]
        row.append(p.steady_short or MISSING)
        rows.append(row)
    return tabulate(rows, headers=head, tablefmt=tablefmt, disable_numparse=True)


def unsteady_notes(points: Sequence[ProbePoint]) -> list[str]:
    """One line per point that never reached a steady state, with its reason."""
    return [
        f"rate {rate_label(p.rate)}: not steady ({p.steady_reason}); its latencies describe a "
        "queue or a batch still growing, not this rate"
        for p in points
        if p.steady is False
    ]
