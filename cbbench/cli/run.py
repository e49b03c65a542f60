"""`cbbench run`: one benchmark run against the bundled engine (or, later, an endpoint)."""

from __future__ import annotations

import contextlib
import math

import typer

from cbbench import options as O
from cbbench.cli import options as C
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.interrupts import StopSignal

# A load-generator worker died or crashed mid-run: the result is written, but it is short of
# that worker's unreported requests (1 is --max-error-rate's, 2 bad input, 130 interrupted).
WORKER_LOST_EXIT = 3
# What a replay takes from the recorded run (so the same options on the command line would
# be silently ignored).
REPLAY_TAKES = ("workload", "seed", "burstiness", "arrival", "time_scale")


def register(app: typer.Typer) -> None:
    app.command("run")(run)


@O.with_options(
    O.Group(O.LoadOptions, "load"),
    O.Group(O.EndpointFlags, "endpoint"),
    O.Group(O.OutputOptions, "output", **O.RUN_OUTPUT),
    O.engine_group(),
)
def run(
    *,
    load: O.LoadOptions,
    endpoint: O.EndpointFlags,
    output: O.OutputOptions,
    engine_opts: EngineArgs,
) -> None:
    """Run a workload against the bundled engine or an endpoint (--endpoint).

    Prints TTFT, TPOT, ITL and end-to-end latency distributions, throughput and goodput, next to
    the engine's per-iteration story (token budget use, batch occupancy, KV use, preemptions,
    bandwidth), and writes the result JSON.
    """
    from cbbench.analysis.error_summary import error_lines
    from cbbench.analysis.result import (
        check_not_an_input,
        check_writable,
        engine_inputs,
        is_stdout,
    )
    from cbbench.bench.runner import RunSpec, execute_run

    if load.replay is not None:  # these were silently ignored: the recorded run's values stand
        ignored = [C.flag_of(n) for n in REPLAY_TAKES if C.given(n)]
        if ignored:
            raise UsageError(f"--replay takes the recorded run's workload, seed and arrivals: "
                             f"drop {', '.join(ignored)}")
    _check_burstiness(load, C.given("burstiness"))
    spec = RunSpec.from_options(load, engine_opts, output, endpoint)
    if spec.endpoint is not None and spec.endpoint.pooling and load.output_len is not None:
        raise UsageError(f"--output-len does not fit --api {spec.endpoint.api}: its workload is "
                         "inputs and their lengths, with no output")
    kind = "http" if spec.endpoint else (
        engine_opts.engine if engine_opts.engine != "auto" else "engine")
    out_path = output.output or C.default_output_path(kind)
    check_writable(out_path)
    inputs = [load.workload, endpoint.tokenizer, load.replay, output.server_log,
              *engine_inputs(engine_opts)]
    check_not_an_input(out_path, inputs, "--output")
    _check_server_log(output.server_log, spec.endpoint is not None)
    also = _also_written(output.output_format, out_path, inputs)

    from cbbench.cli.live import LiveView

    # The live panel: on a terminal, unless --quiet or the result JSON itself is stdout.
    with StopSignal() as stop:
        with LiveView(not output.quiet and not is_stdout(out_path)) as board:
            result = execute_run(spec, should_stop=stop,
                                 on_progress=board.on_progress if board else None, live=board,
                                 records=not output.summary_only)
        # Why requests failed, from their records before --summary-only drops them.
        errors = error_lines(result)
        if output.summary_only:
            result = result.summary_only()
        # Still under the run's handler: a Ctrl-C while the result is printed and written is
        # noted, not raised inside the write (a KeyboardInterrupt that pydantic's serializer
        # wrapped into a traceback, and the finished run's result lost).
        _keep(result, output, out_path, also)
        for line in errors:  # on stderr, after the table: stdout stays the table (or the JSON)
            C.notice(line)
    from cbbench.schema.run import WORKER_LOST

    s = result.summary
    gone = [w for w in s.workers or [] if w.status in WORKER_LOST]
    if gone:
        C.notice(
            f"{len(gone)} load-generator worker(s) did not finish (worker "
            f"{', '.join(str(w.worker) for w in gone)}): the result covers what they reported"
        )
        raise typer.Exit(WORKER_LOST_EXIT)
    failed = s.failed or 0
    sent = (s.completed or 0) + failed
    max_error_rate = output.max_error_rate
    if sent and failed / sent > max_error_rate:
        C.notice(
            f"{failed} of {sent} requests failed ({failed / sent:.1%}), above "
            f"--max-error-rate {max_error_rate:.1%}"
        )
        raise typer.Exit(1)


def _keep(result, output: O.OutputOptions, out_path, also) -> None:
    """Print the finished run's table (or JSON) and write its result, and the export beside it."""
    from cbbench.analysis.result import dumps, is_stdout, write_result
    from cbbench.analysis.table import render_summary  # for a run that ran, not bad input

    # The measurements first: a result that cannot be written (a full disk) is still seen.
    # With --output - the JSON is stdout, so the table goes to stderr.
    to_stdout = is_stdout(out_path)
    try:
        if output.json and not to_stdout:
            typer.echo(dumps(result))
        elif not output.json:
            typer.echo(render_summary(result), err=to_stdout)
    except OSError:  # the terminal is gone (closed pty, SIGHUP): the printout, not the result
        pass
    if also is not None and output.output_format is not None:  # the file's form, as export reads it
        from cbbench.analysis.result import write_atomic_group
        from cbbench.export.files import render
        from cbbench.schema import file_text

        try:
            files = render(result, output.output_format, also)
        except Exception:  # the export cannot be made (parquet without pyarrow): keep the result
            write_result(out_path, result)
            raise
        # The result and its export replaced together: a second Ctrl-C between them left
        # the result beside no export, or beside a previous run's.
        write_atomic_group({out_path: file_text(result), **files})
    else:
        write_result(out_path, result)
    if not output.json and not to_stdout:
        with contextlib.suppress(OSError):  # a closed terminal: the file is written
            typer.echo(f"\nresult: {out_path}")
            if also is not None:
                typer.echo(f"{output.output_format}: {also}")


def _check_server_log(path, endpoint: bool) -> None:
    """--server-log is read only after the run (the server writes it meanwhile): whatever can
    be wrong with it now is refused now, never after a measured run (an unreadable log failed
    only then)."""
    if path is None:
        return
    if not endpoint:
        raise UsageError("--server-log splits an endpoint run's TTFT: give --endpoint")
    if not path.exists():
        raise UsageError(f"--server-log {path}: no such file (cbbench serve "
                         "--request-log opens it at start-up)")
    from cbbench.analysis.input_file import check_input_file

    check_input_file(path, "--server-log")


def _check_burstiness(load: O.LoadOptions, given: bool) -> None:
    """--burstiness shapes the gaps of gamma arrivals at a finite rate; anywhere else it was
    taken and did nothing (exit 0)."""
    if not given or load.replay is not None:  # --replay refuses its own way
        return
    if load.arrival in ("constant", "trace"):
        raise UsageError(f"--burstiness shapes gamma arrivals: with --arrival {load.arrival} it "
                         "does nothing; drop it")
    if load.ramp is None and math.isinf(load.rate()):  # the default, or inf given explicitly
        raise UsageError("--burstiness shapes the gaps between arrivals: at --request-rate inf "
                         "every request arrives at t=0; give --request-rate N or drop it")


def _also_written(fmt: str | None, out_path, inputs: list):
    """--output-format: the export's path beside the result (RESULT.csv for RESULT.json),
    checked before the run; None without the flag."""
    if fmt is None:
        return None
    from pathlib import Path

    from cbbench.analysis.result import check_not_an_input, check_writable, is_stdout
    from cbbench.export.files import default_out, paths

    if is_stdout(out_path):
        raise UsageError("--output-format writes a file beside the result: give --output PATH, "
                         "not -")
    path = default_out(Path(out_path), fmt)
    for written in paths(path, fmt):
        # --output r.csv --output-format csv: the export would replace the result itself.
        if written.resolve() == Path(out_path).resolve():
            raise UsageError(f"--output-format {fmt} writes {written}, the result's own path: "
                             "give --output a .json name")
        check_writable(written)
        check_not_an_input(written, inputs, "--output-format")
    return path

