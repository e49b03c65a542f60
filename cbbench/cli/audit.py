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


def report_table(rep: dict) -> str:
    rows = []
    for name, m in rep["metrics"].items():
        verdict = ("ok" if m["passed"] else "FAIL") if m.get("gated", True) else "(shown)"
        if "median" in m:
            rows.append([name, _fmt(m["median"]), _fmt(m["p99"]), _fmt(m["max"]),
                         m["count"], verdict])
        elif "client" in m:
            rows.append([name + " (client / server)",
                         f"{_fmt(m['error'])}", f"{_fmt(m['client'])} / {_fmt(m['server'])}",
                         "", "", verdict])
        else:
            rows.append([name, f"{m['mismatched']} mismatched", "", "", m["requests"], verdict])
    head = ["metric", "median err (ms)", "p99 |err|", "max err", "n", "verdict"]
    return tabulate(rows, headers=head, tablefmt="simple", disable_numparse=True)


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
        load_result,
        write_result,
    )
    from cbbench.analysis.server_side import audit as A

    if not tolerance_ms >= 0:
        raise UsageError(f"--tolerance-ms must be >= 0, got {tolerance_ms}")
    if tail_tolerance_ms is not None and not tail_tolerance_ms >= 0:
        raise UsageError(f"--tail-tolerance-ms must be >= 0, got {tail_tolerance_ms}")
    if output is not None:  # checked before the audit: never over an input (issue 37)
        out_path = C.output_file(output)
        check_writable(out_path)
        check_not_an_input(out_path, [result, server_log], "--output")
    data = load_result(result)
    log = A.read_server_log(server_log)
    rep = A.audit(data, log, tolerance_ms, tail_tolerance_ms)
    typer.echo(report_table(rep))
    tr = rep["request_transit_ms"]
    if tr["count"]:
        typer.echo(f"request transit (client send -> server arrival): median {tr['median']:.3f} "
                   f"ms, p99 {tr['p99']:.3f} ms")
    typer.echo(
        f"{rep['joined']} requests joined ({rep['not_in_log']} not in the log, "
        f"{rep['without_id']} without an id, {rep['not_comparable']} not a finished stream "
        f"there); tolerance {tolerance_ms:g} ms, counts exact: "
        + ("PASSED" if rep["passed"] else "FAILED")
    )
    if rep.get("cause"):
        typer.echo(f"cause: {rep['cause']}")
    if output is not None:
        write_result(out_path, rep)
    if not rep["passed"]:
        raise typer.Exit(AUDIT_FAILED_EXIT)
