"""`cbbench audit RESULT.json --server-log LOG`: hold a run's per-request figures to the
server's request log (analysis/server_side/audit.py).

Exit codes: 0 every figure within the tolerance, 1 one is not, 2 the input cannot be audited.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from tabulate import tabulate

from cbbench.analysis.server_log import DEFAULT_TOLERANCE_MS
from cbbench.cli import options as C
from cbbench.errors import UsageError

AUDIT_FAILED_EXIT = 1


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:+.3f}" if isinstance(v, float) else str(v)


def _verdict(m: dict) -> str:
    match m:
        case {"gated": False}:  # shown beside the gated ones, never failing the audit
            return "(shown)"
        case {"passed": True}:
            return "ok"
        case _:
            return "FAIL"


def _metric_row(name: str, m: dict) -> list:
    """One metric of the report (analysis/server_side/audit.py), by its kind: an error
    distribution, a p50 on both sides, or a count that must match exactly."""
    match m:
        case {"median": median, "p99": p99, "max": worst, "count": n}:
            return [name, _fmt(median), _fmt(p99), _fmt(worst), n, _verdict(m)]
        case {"client": client, "server": server, "error": error}:
            return [name + " (client / server)", f"{_fmt(error)}",
                    f"{_fmt(client)} / {_fmt(server)}", "", "", _verdict(m)]
        case {"mismatched": wrong, "requests": n}:
            return [name, f"{wrong} mismatched", "", "", n, _verdict(m)]
    raise TypeError(f"audit metric {name}: not a kind the table knows: {sorted(m)}")


def report_table(rep: dict) -> str:
    match rep:
        case {"metrics": dict(metrics)}:
            rows = [_metric_row(name, m) for name, m in metrics.items()]
        case _:
            raise TypeError("an audit report has its metrics")
    head = ["metric", "median err (ms)", "p99 |err|", "max err", "n", "verdict"]
    return tabulate(rows, headers=head, tablefmt="simple", disable_numparse=True)


def report_lines(rep: dict, tolerance_ms: float) -> list[str]:
    """Under the table: the requests' way in, the join's coverage and the verdict, its cause."""
    match rep:
        case {"request_transit_ms": {"count": n, "median": median, "p99": p99},
              "joined": joined, "not_in_log": not_in_log, "without_id": without_id,
              "not_comparable": not_comparable, "passed": passed}:
            pass
        case _:
            raise TypeError("an audit report has its transit, join counts and verdict")
    lines = []
    if n:
        lines.append(f"request transit (client send -> server arrival): median {median:.3f} "
                     f"ms, p99 {p99:.3f} ms")
    lines.append(
        f"{joined} requests joined ({not_in_log} not in the log, "
        f"{without_id} without an id, {not_comparable} not a finished stream "
        f"there); tolerance {tolerance_ms:g} ms, counts exact: "
        + ("PASSED" if passed else "FAILED")
    )
    match rep:
        case {"cause": str(cause)} if cause:
            lines.append(f"cause: {cause}")
    return lines


def audit(
    result: Annotated[Path, typer.Argument(help="A run's result JSON (run with --save-detailed).")],
    server_log: Annotated[
        Path, typer.Option(help="The server's request log (cbbench serve --request-log).")
    ],
    tolerance_ms: Annotated[
        float, typer.Option(help="Largest median error (and p50 difference) a timing may have.")
    ] = DEFAULT_TOLERANCE_MS,
    tail_tolerance_ms: Annotated[
        float | None, typer.Option(help="Also hold each timing's p99 |error| to this (ms).")
    ] = None,
    output: Annotated[
        str | None, typer.Option(help="Write the audit report as JSON to this file.")
    ] = None,
) -> None:
    """Hold a result's per-request figures (TTFT, TTFOT, per-token ITL, TPOT, token counts) to
    a cbbench serve request log, joined by server_request_id (by send order when the result
    has no ids): the client's error per metric
    (median, p99, max), exit 1 past the tolerance (counts: exact)."""
    # Here, not at the top: `cbbench --help` registers every command (cli/app.py), and these
    # bring numpy and the result models.
    from cbbench.analysis.result import (
        check_not_an_input,
        check_writable,
        write_result,
    )
    from cbbench.analysis.server_side import audit as A
    from cbbench.schema import read_run

    if not tolerance_ms >= 0:
        raise UsageError(f"--tolerance-ms must be >= 0, got {tolerance_ms}")
    if tail_tolerance_ms is not None and not tail_tolerance_ms >= 0:
        raise UsageError(f"--tail-tolerance-ms must be >= 0, got {tail_tolerance_ms}")
    if output is not None:  # checked before the audit: never over an input (issue 37)
        out_path = C.output_file(output)
        check_writable(out_path)
        check_not_an_input(out_path, [result, server_log], "--output")
    data = read_run(result)
    log = A.read_server_log(server_log)
    rep = A.audit(data, log, tolerance_ms, tail_tolerance_ms)
    table, lines = report_table(rep), report_lines(rep, tolerance_ms)
    # The report's file first: a write that fails (a full disk) exits 2 with nothing on
    # stdout, where the table was printed and then `cannot write /dev/full`.
    if output is not None:
        write_result(out_path, rep)
    typer.echo(table)
    for line in lines:
        typer.echo(line)
    match rep:
        case {"passed": True}:
            pass
        case _:
            raise typer.Exit(AUDIT_FAILED_EXIT)
