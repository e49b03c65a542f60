"""`cbbench workloads list|show`."""

from __future__ import annotations

from typing import Annotated

import typer
from tabulate import tabulate


def register(app: typer.Typer) -> None:
    app.command("list")(list_workloads)
    app.command("show")(show_workload)


def list_workloads() -> None:
    """List the built-in workloads."""
    from cbbench.load.workload import BUILTIN_WORKLOADS

    rows = []
    for name in sorted(BUILTIN_WORKLOADS):
        w = BUILTIN_WORKLOADS[name]()
        size = f"{len(w.sessions)} sessions" if w.sessions is not None else len(w.requests)
        rows.append([name, size, w.description])
    typer.echo(tabulate(rows, headers=["name", "requests", "description"]))


def show_workload(
    name: Annotated[str, typer.Argument(
        help="A built-in workload name, a JSONL file or a trace (Azure, BurstGPT, Mooncake).")],
) -> None:
    """Show a workload's request count and length statistics."""
    from cbbench.load.workload import length_stats, load_workload

    w = load_workload(name)
    if w.is_sessions:
        _show_sessions(w)
        return
    st = length_stats(w)
    typer.echo(f"{w.name}: {st['count']} requests. {w.description}")
    keys = ["mean", "min", "p50", "p90", "p99", "max"]
    rows = [[k, *(round(st[k][s], 1) for s in keys)] for k in ("prompt_len", "output_len")]
    typer.echo(tabulate(rows, headers=["tokens", *keys]))
    if w.has_arrivals:
        # has_arrivals: every request has one. The span the replay sends: its offsets are
        # from the first arrival (a JSONL file's arrival_s need not start at 0).
        times = [r.arrival_s for r in w.requests if r.arrival_s is not None]
        typer.echo(f"trace arrivals over {max(times) - min(times):.1f} s")
    for note in w.notes:  # what loading left out (a trace's failed rows), as a run says it
        typer.echo(note)


def _show_sessions(w) -> None:
    from cbbench.load.sessions import session_stats

    st = session_stats(w.sessions)
    tps = st["turns_per_session"]
    ctx = st["final_context_len"]
    typer.echo(
        f"{w.name}: {st['sessions']} sessions, {st['turns']} turns "
        f"({tps['mean']:.1f} per session, at most {tps['max']}). {w.description}"
    )
    typer.echo(
        f"final context (history + template + last reply): mean {ctx['mean']:.0f}, "
        f"p50 {ctx['p50']:.0f}, max {ctx['max']} tokens"
    )
