"""`cbbench capacity`: the highest request rate that meets an SLO, found by bracketing and
bisection (capacity.py), every probe reported."""

from __future__ import annotations

import datetime as _dt
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from tabulate import tabulate

from cbbench import options as O
from cbbench.cli import options as C
from cbbench.cli.sweep import (
    DEFAULT_OUT_PARENT,
    PROBE_OUTPUT,
    base_spec,
    point_prep,
    probes_context,
)
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.interrupts import StopSignal

NOT_FOUND_EXIT = 1  # the search ran, but no probed rate met the SLO
MISSING = "-"


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity)


@O.with_options(
    O.Group(O.OutputOptions, "output", only=PROBE_OUTPUT, defaults={
        "slo": O.REQUIRED,
    }, help={
        "slo": "Limits in ms, KEY[_pNN]=MS with KEY in ttft, tpot, e2el, e.g. "
        "ttft_p99=1000,tpot_p99=50. A request meets the SLO when its own TTFT, TPOT and E2EL "
        "are all within their limits; a run meets it when at least the attainment share of its "
        "requests do. The _pNN suffix sets the attainment (p99: 0.99); without one, 0.90.",
        "attainment": "Share of requests that must meet every limit (overrides _pNN).",
        "label": "A name for this search's runs.",
    }),
    O.Group(O.LoadOptions, "load", **O.PROBE_LOAD),
    O.Group(O.ProbeOptions, "probe"),
    O.Group(O.EndpointFlags, "endpoint", **O.PROBE_ENDPOINT),
    O.engine_group(),
)
def capacity(
    precision: Annotated[
        float, typer.Option(help="Stop when the pass/fail bracket is this narrow, relative "
                                "(at least 0.001: rates are probed to 4 significant digits).")
    ] = 0.05,
    start_rate: Annotated[
        float | None,
        typer.Option(help="First rate to probe. Default: half the saturation rate that a "
                     "rate-inf probe measures."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="capacity.json: the answer and every probe. "
                     "Default: results/runs/capacity-<time>.json.", parser=O.output_file,
                     metavar="<path>"),
    ] = None,
    runs_dir: Annotated[
        Path | None, typer.Option(help="Also save each probe's full result in this folder.")
    ] = None,
    *,
    output: O.OutputOptions,
    load: O.LoadOptions,
    probe: O.ProbeOptions,
    endpoint: O.EndpointFlags,
    engine_opts: EngineArgs,
) -> None:
    """Find the highest request rate that meets an SLO.

    Brackets from a first guess (doubling or halving), then bisects until the bracket is within
    --precision. A probe passes only when it meets the SLO and reached a steady state.
    """
    from cbbench.analysis.result import (
        check_folder_not_inputs,
        check_not_an_input,
        check_writable,
        engine_inputs,
        write_atomic,
    )
    from cbbench.bench.capacity import (
        ABOVE_MAX,
        BELOW_MIN,
        INTERRUPTED,
        PROBE_FILES,
        TOO_SHORT,
        Prober,
        SearchResult,
        parse_precision,
        search,
    )
    from cbbench.bench.probe import ProbeSizing, saturation_lower_bound, saturation_rate
    from cbbench.bench.sweep import check_no_folder_at

    slo_spec = output.attainment_slo()
    if slo_spec is None:
        raise UsageError("--slo is required, e.g. --slo ttft_p99=1000,tpot_p99=50")
    parse_precision(precision)
    if start_rate is not None and not (start_rate > 0 and math.isfinite(start_rate)):
        raise UsageError(f"--start-rate must be a positive number, got {start_rate}")
    assert load.num_requests is not None  # PROBE_LOAD gives it a default: a probe has a size
    sizing = ProbeSizing(load.num_requests, probe.min_duration, probe.max_requests)
    if start_rate is not None:  # as sweep checks its --rates: before probe 1, not in it
        sizing.check_schedule(start_rate, "--start-rate")
    base = base_spec(load, output, endpoint, engine_opts)
    prep = point_prep(probe)
    prep.check(base)
    out_path = out or DEFAULT_OUT_PARENT / _dt.datetime.now().strftime("capacity-%Y%m%d-%H%M%S.json")
    if runs_dir is not None:  # before check_writable, which makes the folders it names
        check_outputs_apart(out_path, runs_dir)
    check_writable(out_path)
    inputs = [load.workload, endpoint.tokenizer, *engine_inputs(engine_opts)]
    check_not_an_input(out_path, inputs, "--out")
    if runs_dir is not None:
        check_writable(runs_dir / "probe.json")
        check_no_folder_at(runs_dir, [PROBE_FILES], "a probe's result", "--runs-dir")
        check_folder_not_inputs(runs_dir, [PROBE_FILES], inputs, "--runs-dir")

    saturation = sat_point = config = prober = found = None

    # The interrupt contract of `run`: the first signal stops dispatching, the probe in
    # progress is kept marked interrupted, and the file says so; a second exits 130, and
    # capacity.json still keeps the probes finished before it (as sweep.json keeps its points).
    with StopSignal() as stop, probes_context(base.load_plan):
        try:
            if start_rate is None:
                sat_result, sat_point = saturation_probe(base, sizing, slo_spec, stop, prep,
                                                         runs_dir)
                saturation = saturation_rate(sat_result)
                config = sat_result.config
                if stop():
                    found = SearchResult(INTERRUPTED, None, None, None, [])
                else:
                    C.notice(saturation_line(saturation, sat_point))
                    short = saturation_lower_bound(sat_result)
                    if short is not None:  # the search starts low; it climbs from there
                        C.notice(f"warning: {short}")
                    if not saturation > 0:
                        raise UsageError("the rate-inf probe completed nothing; give --start-rate")
                    start_rate = saturation * 0.5
            if found is None:
                assert start_rate is not None  # given, or half the saturation probe's
                prober = Prober(base, sizing, slo_spec, runs_dir, stop, prep)
                found = search(prober, start_rate, precision, should_stop=stop,
                               fits=sizing.schedule_fits)
        except KeyboardInterrupt:  # a second signal: keep what finished, then leave (130)
            keep_finished(out_path, prober, sat_point, lambda found: capacity_text(
                found, slo_spec, precision, sizing, prep, saturation, sat_point, config, prober))
            raise

        # Still under the search's handler: a Ctrl-C while the answer is printed and written
        # is noted, not raised (capacity.json, every probe, was lost).
        text = capacity_text(found, slo_spec, precision, sizing, prep, saturation, sat_point,
                             config, prober)

        # The probes first: a file that cannot be written (a full disk) still shows them.
        typer.echo(f"SLO: {slo_spec.describe()}")
        if saturation is not None:
            typer.echo(saturation_line(saturation, sat_point))
        typer.echo("latencies in ms")
        typer.echo(probe_table(found.probes, sat_point))
        typer.echo("")
        typer.echo(answer_line(found))
        write_atomic(out_path, text)
    typer.echo(f"\ncapacity: {out_path}")
    if found.status == BELOW_MIN or (found.status == TOO_SHORT and found.lo is None):
        raise typer.Exit(NOT_FOUND_EXIT)
    if found.status == ABOVE_MAX:
        C.notice("every probe passed up to the search's ceiling: the capacity is at least that")


def saturation_probe(base, sizing, slo, stop, prep, runs_dir: Path | None):
    """Probe 0, at rate inf: its result (saved in --runs-dir) and its row."""
    from cbbench.analysis.result import write_result
    from cbbench.bench.capacity import probe_file
    from cbbench.bench.probe import run_probe, summarize_probe

    C.notice(f"probe 0 (saturation): rate inf, {sizing.requests_for(math.inf)} requests")
    result = run_probe(base, math.inf, sizing, slo, stop, prep)
    path = None if runs_dir is None else runs_dir / probe_file(0, math.inf)
    if path is not None:
        write_result(path, result)
    return result, summarize_probe(math.inf, result, slo, None if path is None else str(path))


def keep_finished(out_path: Path, prober, sat_point, document) -> None:
    """On a second signal, capacity.json with what finished before it (the saturation probe,
    the probes judged), marked interrupted, as sweep.json keeps a sweep's finished points."""
    from cbbench.analysis.result import write_atomic
    from cbbench.bench.capacity import stopped

    probes = prober.probes if prober is not None else []
    if sat_point is None and not probes:
        return  # nothing finished: nothing to keep
    write_atomic(out_path, document(stopped(probes)))
    C.notice(f"capacity: {out_path} keeps the {len(probes)} probe(s) finished before the signal")


def capacity_text(found, slo, precision: float, sizing, prep, saturation: float | None,
                  sat_point, config, prober) -> str:
    """capacity.json's text: the answer, the saturation probe and every probe judged; the
    config the saturation probe's, else the first search probe's."""
    from cbbench.bench.capacity import INTERRUPTED
    from cbbench.bench.runner import recorded_command
    from cbbench.bench.sweep import shared_config
    from cbbench.schema import (
        CAPACITY_KIND,
        CAPACITY_SCHEMA_VERSION,
        CapacityFile,
        file_text,
        from_built,
        to_dict,
    )

    config = config or (prober.config if prober else None)
    # The file's keys in the file's order: the model dumps them as given.
    return file_text(from_built(CapacityFile, {
        "kind": CAPACITY_KIND,
        "schema_version": CAPACITY_SCHEMA_VERSION,
        "slo": slo.to_dict(),
        "precision": precision,
        "sizing": sizing.to_dict(),
        "points_prep": prep.to_dict(),
        "status": found.status,
        "capacity": found.capacity,
        "bracket": [found.lo, found.hi],
        "margin": found.margin,
        "saturation_rate": saturation,
        "saturation_probe": sat_point.to_dict() if sat_point else None,
        "config": shared_config(to_dict(config) if config is not None else {}),
        "command": recorded_command(sys.argv[1:]),
        "probes": [p.to_dict() for p in found.probes],
        "interrupted": found.status == INTERRUPTED,
    }, "the capacity search"))


def check_outputs_apart(out: Path, runs_dir: Path) -> None:
    """Refuse, before anything runs, a --out that --runs-dir's files would overwrite or block:
    the same path (the search ran, then writing capacity.json failed on the folder), a probe's
    file name in --runs-dir (probe 1's result silently replaced by the capacity file), or
    --runs-dir inside --out (a file cannot hold a folder)."""
    import fnmatch
    import os

    from cbbench.analysis.result import is_stdout
    from cbbench.bench.capacity import PROBE_FILES

    if is_stdout(out):
        return
    real_out, real_runs = Path(os.path.realpath(out)), Path(os.path.realpath(runs_dir))
    if real_out == real_runs:
        raise UsageError(f"--out {out} and --runs-dir {runs_dir} are one path: give the "
                         "capacity file and the probes' folder each their own")
    if real_out.parent == real_runs and fnmatch.fnmatch(real_out.name, PROBE_FILES):
        raise UsageError(f"--out {out} is a name a probe's result takes in --runs-dir "
                         f"{runs_dir} ({PROBE_FILES}): give the capacity file another name")
    if real_out in real_runs.parents:
        raise UsageError(f"--runs-dir {runs_dir} lies inside --out {out}, the capacity file: "
                         "give a folder outside it")


def saturation_line(saturation: float, sat_point=None) -> str:
    """The rate-inf probe's sustained rate, told apart from its row's achieved rate: the first
    counts the tokens made while requests still queued (bench/probe.py saturation_rate), the
    second completed / duration, which the drain at the end pulls down."""
    line = f"saturation (rate inf): ~{saturation:.4g} req/s sustained while requests queued"
    achieved = getattr(sat_point, "achieved_request_rate", None)
    if achieved is not None:
        line += (f" (probe 0's row: {achieved:.2f} req/s achieved over the whole run, its "
                 "drain included)")
    return line


def probe_table(probes: Sequence, saturation=None, tablefmt: str = "simple") -> str:
    """Every probe in order; the rate-inf saturation probe (a ProbePoint) first, unjudged."""
    from cbbench.bench.probe import rate_label
    from cbbench.bench.sweep import cell

    head = ["#", "phase", "rate (req/s)", "n", "attainment", "result", "steady",
            "achieved (req/s)", "output (tok/s)", "TTFT p99", "TPOT p99", "E2EL p99"]

    def row(index: str, phase: str, pt, attainment, verdict: str) -> list[str]:
        n = str(pt.num_requests) + (f" ({pt.failed} failed)" if pt.failed else "")
        att = MISSING if attainment is None else f"{attainment:.1%}"
        return [index, phase, rate_label(pt.rate), n, att, verdict, pt.steady_short or MISSING,
                cell(pt.achieved_request_rate, 2), cell(pt.output_throughput),
                cell(pt.ttft_p99_ms), cell(pt.tpot_p99_ms), cell(pt.e2el_p99_ms)]

    rows = []
    if saturation is not None:
        rows.append(row("0", "saturation", saturation, saturation.slo_attainment, MISSING))
    for p in probes:
        verdict = ("interrupted" if p.interrupted else "pass" if p.passed
                   else "too short to judge" if p.too_short
                   else "fail (unsteady)" if p.meets_slo else "fail")
        rows.append(row(str(p.index), p.phase, p.point, p.attainment, verdict))
    return tabulate(rows, headers=head, tablefmt=tablefmt, disable_numparse=True)


def answer_line(found) -> str:
    from cbbench.bench.capacity import ABOVE_MAX, BELOW_MIN, BUDGET, INTERRUPTED, TOO_SHORT

    if found.status == INTERRUPTED:
        best = "no probe passed" if found.lo is None else f">= {found.lo:.4g} req/s passed"
        return f"capacity: interrupted after {len(found.probes)} probe(s): {best} so far"
    if found.status == BELOW_MIN:
        return (f"capacity: not found: no probed rate met the SLO (the lowest failed at "
                f"{found.hi:.4g} req/s)")
    if found.status == ABOVE_MAX:
        return (f"capacity: >= {found.lo:.4g} req/s (every probe passed up to the search's "
                "ceiling)")
    if found.status == TOO_SHORT:
        best = "not judged" if found.lo is None else f">= {found.lo:.4g} req/s (passes)"
        fails = "" if found.hi is None else f"; {found.hi:.4g} req/s fails"
        return (f"capacity: {best}: {found.unjudged:.4g} req/s met the SLO but its probe was "
                "too short to judge whether the target keeps up there (its steady column)"
                f"{fails}; more requests a probe (--num-requests, --min-duration) judge it")
    text = (f"capacity: {found.capacity:.4g} req/s (passes; {found.hi:.4g} req/s fails: "
            f"bracket +{found.margin:.1%})")
    if found.status == BUDGET:
        text += " - the probe budget ran out before the bracket reached --precision"
    return text
