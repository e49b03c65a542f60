"""`cbbench report`: PNG plots and two self-contained HTML pages for one or more results: an
interactive one (report.html, plotly embedded) and a static one (report-static.html, no script)."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from cbbench import options as O
from cbbench.errors import UsageError

PAGE_NAME = "report.html"  # interactive (plotly embedded), opens offline
STATIC_PAGE_NAME = "report-static.html"  # PNGs only, no script: for mail and CI attachments
DPI = 100
STATIC = "static"
CONTINUOUS = "continuous"


def register(app: typer.Typer) -> None:
    app.command("report")(report)


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    caption: str
    draw: Callable  # (results) -> Figure


@O.with_options(O.Group(O.OutputOptions, "output", **O.READ_OUTPUT, help={
    "percentiles": "The summary tables' latency rows at these percentiles, e.g. 50,99.9 "
    "(computed from a result's requests where it did not store them)."}))
def report(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Result files (the first is the reference), and/or sweep.json files from "
            "`cbbench sweep` (drawn as latency-throughput curves)."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Folder for the PNGs and report.html.")],
    title: Annotated[str, typer.Option(help="The page title.")] = "cbbench report",
    max_gantt_requests: Annotated[
        int, typer.Option(help="Requests drawn in the static-vs-continuous timeline.")
    ] = 100,
    *,
    output: O.OutputOptions,
) -> None:
    """Plot results as PNGs and one self-contained HTML page.

    Latency CDFs, the per-iteration token budget, batch occupancy, KV use and bandwidth, and (for
    a static and a continuous run) a request timeline; the HTML page holds them all with the
    summary tables.
    """
    from cbbench.analysis.comparison.compare import file_labels, load_labeled
    from cbbench.analysis.input_file import check_input_file
    from cbbench.analysis.result import (
        check_folder_not_inputs,
        check_writable,
        write_atomic_group,
    )
    from cbbench.report.check import check_report_input
    from cbbench.report.html import PlotSection, render_page
    from cbbench.report.notes import section_notes
    from cbbench.schema import to_dict

    if max_gantt_requests < 1:
        raise UsageError("--max-gantt-requests must be >= 1")
    for p in files:  # a FIFO with no writer hung report until killed
        check_input_file(p, "result file")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    check_writable(out / PAGE_NAME)
    from cbbench.report.sweep_plot import is_sweep_file, latency_throughput, load_sweep

    sweep_files = [p for p in files if is_sweep_file(p)]
    files = [p for p in files if p not in sweep_files]
    sweeps = [(lbl, load_sweep(p)) for lbl, p in zip(file_labels(sweep_files), sweep_files)]
    from cbbench.analysis.comparison.compare import with_percentiles

    results = load_labeled(files)
    for path, x in zip(files, results):
        check_report_input(to_dict(x.result), path)  # its checks read the file's dict
    results, rows = with_percentiles(results, output.percentiles_given())

    specs = plot_specs(results, max_gantt_requests) if results else []
    if sweeps:
        specs.append(PlotSpec(
            "latency_throughput", "Latency vs throughput",
            "TTFT p99 and TPOT p99 against achieved output throughput; labels are offered "
            "rates; hollow markers never reached a steady state; squares are rate inf; dashed "
            "lines are SLO limits.",
            lambda _r: latency_throughput(sweeps),
        ))
    names = [f"{s.key}.png" for s in specs] + [STATIC_PAGE_NAME] + ([PAGE_NAME] if results
                                                                     else [])
    # Before a byte is written: an input named like one of the report's files is refused, and
    # so is a report file's name taken by a folder or a device.
    check_folder_not_inputs(out, names, [*files, *sweep_files], "--out")
    _check_report_files(out, names)
    sections = []
    for spec in specs:
        png = _png(spec.draw(results))
        sections.append(
            PlotSection(spec.key, spec.title, spec.caption, png, section_notes(spec.key, results))
        )
    paths = [str(p) for p in files + sweep_files]
    pages: dict[Path, bytes | str] = {out / f"{s.key}.png": s.png for s in sections}
    pages[out / STATIC_PAGE_NAME] = render_page(title, results, paths, sections,
                                                page_notes(results), rows)
    if results:
        pages[out / PAGE_NAME] = _interactive_page(title, results, paths, max_gantt_requests,
                                                   bool(sweeps), rows)
    # Every file rendered, then all replaced together: written one by one, a kv_usage.png
    # that was a folder (or a full disk) stopped the report with three new PNGs beside the
    # old page, a report of two runs at once.
    write_atomic_group(pages)
    for path in pages:
        typer.echo(str(path))


def _check_report_files(out: Path, names: Sequence[str]) -> None:
    """UsageError (one line) where one of the report's files is something a file cannot
    replace (a folder) or is not a file (a device, a FIFO): the report writes all or none."""
    for name in names:
        path = out / name
        if path.is_dir():
            raise UsageError(f"--out {path} is a folder: the report writes its file there; "
                             "move it or give another --out")
        if path.exists() and not path.is_file():
            raise UsageError(f"--out {path} is not a file (a device or a FIFO): the report "
                             "replaces its files together; give another --out")


def _interactive_page(title: str, results: Sequence, paths: list[str], max_gantt_requests: int,
                      with_sweeps: bool, rows: Sequence = ()) -> str:
    from cbbench.report import interactive

    page_plots, notes = interactive.build_plots(results, max_gantt_requests, gantt_pair(results))
    notes = [*page_notes(results), *notes]
    if with_sweeps:
        notes.append(f"Latency-throughput curves of the sweeps: in {STATIC_PAGE_NAME}.")
    return interactive.render_interactive(title, results, paths, page_plots, notes,
                                          interactive.plotly_js(), *([rows] if rows else []))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def gantt_pair(results: Sequence) -> list | None:
    """The first static run and the first continuous run, static first; None without both."""
    from cbbench.schema.coerce import as_run

    by_sched: dict[str | None, Any] = {}
    for x in results:
        by_sched.setdefault(as_run(x.result).config.scheduler, x)
    if STATIC in by_sched and CONTINUOUS in by_sched:
        return [by_sched[STATIC], by_sched[CONTINUOUS]]
    return None


def plot_specs(results: Sequence, max_gantt_requests: int) -> list[PlotSpec]:
    from cbbench.report import plots

    specs = [
        PlotSpec("latency_cdfs", "Latency CDFs",
                 "Share of requests (ITL: of token gaps) at or below each latency; dotted lines "
                 "mark p50 and p99. TTFT and E2EL count from the intended start.",
                 plots.latency_cdfs),
        PlotSpec("token_budget", "Token budget per iteration",
                 "Prefill and decode tokens computed in each iteration, under the per-iteration "
                 "token budget; running and waiting requests on the right axis.",
                 plots.token_budget_timeline),
        PlotSpec("batch_occupancy", "Batch occupancy",
                 "Sequence slots (up to max_num_seqs) per iteration. Red: slots idle while "
                 "requests waited, the capacity static batching leaves unused.",
                 plots.batch_occupancy),
        PlotSpec("kv_usage", "KV cache use",
                 "KV blocks in use as a share of the pool over time; crosses mark iterations "
                 "that preempted requests.",
                 plots.kv_usage),
        PlotSpec("bandwidth", plots.bandwidth_title(results),
                 "Analytic bandwidth per iteration (the cost model's bytes moved over the "
                 "iteration's time) and, where recorded, the bandwidth GPU telemetry (NVML, "
                 "DCGM) measured.",
                 plots.bandwidth_timeline),
    ]
    pair = gantt_pair(results)
    if pair is not None:
        specs.append(PlotSpec(
            "request_timeline", "Request timeline: static vs continuous",
            "Each request's time queued (grey), from admission to its first token (orange) "
            "and decoding (blue), from its intended start; the same requests in the same rows.",
            lambda _results: plots.request_gantt(pair, max_gantt_requests),
        ))
    return specs


def page_notes(results: Sequence) -> list[str]:
    from cbbench.analysis.comparison.compare import workload_note
    from cbbench.schema.coerce import as_run

    notes = []
    if len(results) > 1 and (note := workload_note(results)):
        notes.append(note)
    schedulers = {as_run(x.result).config.scheduler for x in results}
    if gantt_pair(results) is None and STATIC in schedulers:  # a comparison left one-sided
        notes.append(
            "No request timeline: it needs one static and one continuous run among the results."
        )
    interrupted = [x.label for x in results if as_run(x.result).interrupted]
    if interrupted:
        notes.append(f"Interrupted runs ({', '.join(interrupted)}): figures cover only what finished.")
    return notes
