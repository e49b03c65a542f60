"""`cbbench gate`: fail CI when a result regressed against a baseline.

Exit codes: 0 every metric held, 1 a metric regressed, 2 the input cannot be compared.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from tabulate import tabulate

from cbbench import options as O
from cbbench.cli import options as C
from cbbench.errors import UsageError

if TYPE_CHECKING:
    from cbbench.analysis.comparison import gate as G  # numpy and the result models: imported
    # where a gate runs, not where `cbbench --help` registers the command (cli/app.py)

REGRESSION_EXIT = 1
# Fewer runs than this per side hardly measure the noise the interval allows for.
MIN_NOISE_FILES = 3
BASELINE_FLAG = "--baseline"
NEW_FLAG = "--new"
# --baseline and --new each take every file up to the next option, which click cannot
# express; they are parsed from the leftover arguments instead (see _split_files).
COMMAND_SETTINGS: dict[str, Any] = {
    "context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
    "options_metavar": "NEW.json... --baseline BASE.json... [OPTIONS]",
}
GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
HEADERS = ["metric", "better", "baseline", "new", "change", "limit", "verdict"]


def register(app: typer.Typer) -> None:
    app.command("gate", **COMMAND_SETTINGS)(gate)


@O.with_options(O.Group(O.WindowOptions, "windowed"),
                O.Group(O.OutputOptions, "output", **O.READ_OUTPUT,
                        help={"percentiles": "The default latency thresholds at these "
                              "percentiles (ttft_ms.p50, ttft_ms.p99.9, ...) instead of p50/p99; "
                              "a percentile a result did not store is computed from its "
                              "requests."}))
def gate(
    ctx: typer.Context,
    max_regression: Annotated[
        list[str] | None,
        typer.Option(
            "--max-regression",
            metavar="METRIC=LIMIT",
            help="METRIC=PCT% or METRIC=ABS, repeatable; METRIC is a dotted path into the "
            "summary (output_throughput, ttft_ms.p99, engine.num_preemptions). Overrides the "
            "default for that metric; a metric given twice (10% and 2) is held to both.",
        ),
    ] = None,
    no_defaults: Annotated[
        bool, typer.Option("--no-defaults", help="Check only the --max-regression metrics.")
    ] = False,
    allow_different_workload: Annotated[
        bool,
        typer.Option(
            "--allow-different-workload",
            help="Compare results that served different request sets or arrivals.",
        ),
    ] = False,
    junit: Annotated[
        Path | None, typer.Option(help="Also write JUnit XML: one testcase per metric.",
                                  parser=C.output_file, metavar="<path>")
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(help="Also write a Markdown summary (e.g. to $GITHUB_STEP_SUMMARY).",
                     parser=C.output_file, metavar="<path>"),
    ] = None,
    *,
    windowed: O.WindowOptions,
    output: O.OutputOptions,
) -> None:
    """Fail CI when a result regressed against a baseline, metric by metric.

    Exit 0 when every metric holds, 1 when one regressed, 2 on input that cannot be compared.
    A new result that completed no request has no latency: its latency metrics regress (a
    baseline like it has nothing to hold the new one to: exit 2).

    --baseline and --new each take the files that follow them. One file per side compares
    exactly (the simulator has no noise); several per side decide by Welch's t 95%
    interval of the change in the mean, and a metric fails only when the whole interval is past
    its limit (failed, a count, compares the per-side means exactly).

    Defaults: output_throughput and request_throughput 5%; ttft_ms.p50/p99, tpot_ms.p50/p99,
    itl_ms.p99 and e2el_ms.p99 10%; failed 0 (no new failures). A percentile a result did not
    store is computed from its requests; a default one that cannot be (ITL without
    --save-detailed) is left out with a warning.
    """
    from cbbench.analysis.comparison import gate as G
    from cbbench.analysis.input_file import check_input_file
    from cbbench.analysis.result import check_distinct_outputs, check_not_an_input, check_writable
    from cbbench.schema import RunResult, as_run, read_run

    new_paths, base_paths = _split_files(ctx.args)
    for p in [*base_paths, *new_paths]:  # a FIFO with no writer hung gate until killed
        check_input_file(p, "result file")
    percentiles = output.percentiles_given()
    checks_wanted = G.thresholds(max_regression or [], use_defaults=not no_defaults,
                                 percentiles=percentiles)
    outputs = [("--junit", junit), ("--markdown", markdown)]
    check_distinct_outputs(outputs)  # before check_writable, which makes missing folders
    for flag, path in outputs:
        if path is not None:
            check_writable(path)
            check_not_an_input(path, [*new_paths, *base_paths], flag)
    from cbbench.analysis.comparison.windows import check_metric, select_window

    window = windowed.window
    for t in checks_wanted:
        check_metric(t.metric, window)
    from cbbench.analysis.summary.percentiles import percentile_of, with_percentiles_filled
    from cbbench.analysis.summary.slice_percentiles import (
        slice_percentile_of,
        with_slice_percentiles_filled,
    )

    # The percentiles the thresholds read, whether or not --percentiles asked: a result that
    # did not store one (its run had other --percentiles) has it from its window's requests.
    read_at = (percentile_of(t.metric) for t in checks_wanted)
    fill = sorted({*(percentiles or ()), *(q for q in read_at if q is not None)})

    # ... and a slices.worst percentile from the requests that ended in each slice.
    slice_fill = [a for t in checks_wanted if (a := slice_percentile_of(t.metric)) is not None]

    def read(p: Path) -> RunResult | dict:
        r = as_run(select_window(read_run(p), window, str(p)), str(p))
        r = with_slice_percentiles_filled(r, slice_fill, p) if slice_fill else r
        return with_percentiles_filled(r, fill, p) if fill else r

    baseline = [(str(p), read(p)) for p in base_paths]
    new = [(str(p), read(p)) for p in new_paths]
    G.comparable_runs(baseline, new, checks_wanted, allow_different_workload)  # refused first
    named = {G.parse_threshold(t).metric for t in max_regression or []}
    checks_wanted, unstored = G.without_unstored(checks_wanted, [*baseline, *new], named)
    checks = G.run_gate(baseline, new, checks_wanted, allow_different_workload)
    for line in unstored:
        C.notice(line)
    if max(len(baseline), len(new)) > 1 and min(len(baseline), len(new)) < MIN_NOISE_FILES:
        C.notice(
            f"warning: {len(baseline)} baseline and {len(new)} new files; fewer than "
            f"{MIN_NOISE_FILES} runs on a side hardly measure its noise (one run: none)"
        )

    # The files first: a write that fails (a full disk) exits 2 before any verdict is shown.
    if junit is not None:
        _write(junit, junit_xml(checks, base_paths, new_paths))
    if markdown is not None:
        _write_markdown(markdown, markdown_summary(checks, base_paths, new_paths))
    if window == "steady":
        typer.echo("window: steady state (summary.steady_state)")
    unasked = defaults_line(checks_wanted, max_regression or [], no_defaults)
    if unasked:
        typer.echo(unasked)
    typer.echo(render_table(checks))
    typer.echo("")
    typer.echo(verdict_line(checks))
    if not G.passed(checks):
        raise typer.Exit(REGRESSION_EXIT)


def defaults_line(wanted: Sequence[G.Threshold], given: Sequence[str], no_defaults: bool) -> str:
    """The metrics gated by default, not named by --max-regression: said, with their limits,
    so a failure on one nobody asked for is not a surprise."""
    from cbbench.analysis.comparison import gate as G

    if no_defaults:
        return ""
    named = {G.parse_threshold(t).metric for t in given}
    unasked = [t for t in wanted if t.metric not in named]
    if not unasked:
        return ""
    limits = ", ".join(f"{t.metric} {t.text()}" for t in unasked)
    return (f"also gated by default ({len(unasked)} metrics not named by --max-regression; "
            f"--no-defaults drops them): {limits}")


def _split_files(args: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """Leftover arguments -> (new files, baseline files). Bare files are new until a
    --baseline or --new flag switches the list they go to; `--flag=FILE` works too."""
    new: list[Path] = []
    base: list[Path] = []
    target = new
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag in (BASELINE_FLAG, NEW_FLAG):
            target = base if flag == BASELINE_FLAG else new
            if eq:
                target.append(Path(value))
        elif arg.startswith("-") and arg != "-":
            raise UsageError(f"no such option: {arg}")
        else:
            target.append(Path(arg))
    if not base:
        raise UsageError("no baseline: give --baseline BASE.json (one or more files)")
    if not new:
        raise UsageError("no new result: give NEW.json (or --new NEW.json ...)")
    return new, base


def _write(path: Path, text: str) -> None:
    from cbbench.analysis.result import write_atomic

    write_atomic(path, text)


def _write_markdown(path: Path, text: str) -> None:
    """GitHub's step summary collects what every command of a step appends, so append to it;
    any other file is replaced whole."""
    from cbbench.analysis.result import clean_text

    text = clean_text(text)  # a file name's non-UTF-8 bytes (lone surrogates) as U+FFFD
    summary = os.environ.get(GITHUB_STEP_SUMMARY)
    if summary and Path(summary).resolve() == path.resolve():
        try:
            with path.open("a", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    else:
        _write(path, text)


# ---- rendering ----------------------------------------------------------------------------


def fmt_value(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.4g}"


# The most digits a change past its limit gets to show it past (+10.0001%).
MAX_CHANGE_DIGITS = 6


def fmt_change(c: float, relative: bool, limit: float | None = None) -> str:
    """A change as the table shows it; given the ``limit`` it is past, with the digits that
    show it past: "+10.0%  10%  REGRESSED" read as a wrong verdict (pytest-benchmark prints 9)."""
    if math.isinf(c):
        return "+inf" if c > 0 else "-inf"
    text = ""
    for digits in range(1, MAX_CHANGE_DIGITS + 1):
        text = f"{c * 100:+.{digits}f}%" if relative else f"{c:+,.{digits + 3}g}"
        if limit is None or abs(float(text.rstrip("%").replace(",", ""))) != limit:
            break
    return text


def change_text(c: G.Check) -> str:
    if c.none_completed:  # no value to move from: say why
        if c.n_new == 1:
            return "no completed request"
        return f"{c.none_completed} of {c.n_new} runs completed no request"
    from cbbench.analysis.comparison import gate as G

    rel = c.threshold.relative
    limit = None if c.verdict == G.OK else c.threshold.limit
    text = fmt_change(c.change, rel, limit)
    if c.low is not None and c.high is not None:  # noise-aware: the change's interval
        text += f" [{fmt_change(c.low, rel, limit)}, {fmt_change(c.high, rel, limit)}]"
    return text


def side_text(value: float, n: int) -> str:
    if math.isnan(value):  # a latency of runs that completed no request
        return "-"
    return fmt_value(value) if n == 1 else f"{fmt_value(value)} (mean of {n})"


def rows(checks: Sequence[G.Check]) -> list[list[str]]:
    return [
        [
            c.metric,
            c.direction,
            side_text(c.baseline, c.n_baseline),
            side_text(c.new, c.n_new),
            change_text(c),
            c.threshold.text(),
            c.verdict,
        ]
        for c in checks
    ]


def render_table(checks: Sequence[G.Check]) -> str:
    return tabulate(rows(checks), headers=HEADERS, tablefmt="simple", disable_numparse=True)


def verdict_line(checks: Sequence[G.Check]) -> str:
    from cbbench.analysis.comparison import gate as G

    bad = [c.metric for c in checks if c.verdict == G.REGRESSED]
    better = sum(c.verdict == G.IMPROVED for c in checks)
    mode = (
        f"Welch's t {G.CONFIDENCE:.0%} intervals"
        if any(c.noise_aware for c in checks)
        else "exact comparison"
    )
    if bad:
        return f"gate: FAILED: {len(bad)} of {len(checks)} metrics regressed ({', '.join(bad)}); {mode}"
    return f"gate: passed: {len(checks)} metrics held, {better} improved; {mode}"


def junit_xml(checks: Sequence[G.Check], base: Sequence[Path], new: Sequence[Path]) -> str:
    from cbbench.analysis.comparison import gate as G
    from cbbench.export.writable import xml_text

    failures = sum(c.verdict == G.REGRESSED for c in checks)
    suites = ET.Element("testsuites", tests=str(len(checks)), failures=str(failures))
    suite = ET.SubElement(
        suites, "testsuite", name="cbbench gate", tests=str(len(checks)),
        failures=str(failures), errors="0", skipped="0",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="baseline", value=" ".join(map(str, base)))
    ET.SubElement(props, "property", name="new", value=" ".join(map(str, new)))
    repeated = {c.metric for c in checks if sum(d.metric == c.metric for d in checks) > 1}
    for c, row in zip(checks, rows(checks)):
        # A metric held to two limits is two testcases, named apart: CI collates by name.
        name = f"{c.metric} ({c.threshold.text()})" if c.metric in repeated else c.metric
        case = ET.SubElement(suite, "testcase", classname="cbbench.gate", name=name)
        detail = ", ".join(f"{h}: {v}" for h, v in zip(HEADERS[1:], row[1:]))
        if c.verdict == G.REGRESSED:
            failure = ET.SubElement(
                case, "failure", type="regression",
                message=f"{c.metric} regressed: {change_text(c)} (limit {c.threshold.text()})",
            )
            failure.text = detail
        else:
            ET.SubElement(case, "system-out").text = detail
    ET.indent(suites)
    # The paths may hold what XML cannot (a control character or non-UTF-8 bytes in a file name)
    text = xml_text(ET.tostring(suites, encoding="unicode"))
    return '<?xml version="1.0" encoding="utf-8"?>\n' + text + "\n"


def markdown_summary(checks: Sequence[G.Check], base: Sequence[Path], new: Sequence[Path]) -> str:
    from cbbench.analysis.comparison import gate as G

    ok = G.passed(checks)
    head = "### cbbench gate: " + ("✅ passed" if ok else "❌ FAILED")
    files = [
        f"- baseline: {', '.join(f'`{p}`' for p in base)}",
        f"- new: {', '.join(f'`{p}`' for p in new)}",
    ]
    table_rows = [[*r[:-1], f"**{r[-1]}**" if r[-1] == G.REGRESSED else r[-1]] for r in rows(checks)]
    table = tabulate(table_rows, headers=HEADERS, tablefmt="github", disable_numparse=True)
    return "\n".join([head, "", *files, "", table, "", verdict_line(checks), ""])
