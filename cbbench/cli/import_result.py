"""`cbbench import`: another tool's per-request output as a cbbench result.

  vllm-bench  `vllm bench serve --save-result --save-detailed`'s JSON
  aiperf      AIPerf's per-request records, profile_export.jsonl
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cbbench.analysis.result import check_not_an_input, read_json_file, write_result
from cbbench.cli import options as C
from cbbench.errors import UsageError
from cbbench.importers import aiperf, vllm_bench
from cbbench.importers.result import build_result

TOOLS = (vllm_bench.TOOL, aiperf.TOOL)


def register(app: typer.Typer) -> None:
    app.command("import")(import_result)


def import_result(
    file: Annotated[Path, typer.Argument(help="The other tool's result file.", metavar="FILE")],
    tool: Annotated[str, typer.Option("--from", help="The tool that wrote it: vllm-bench | aiperf.")],
    out: Annotated[
        Path, typer.Option("--out", parser=C.output_file, metavar="<path>",
                           help="The cbbench result JSON to write.")
    ],
) -> None:
    """Turn another tool's per-request output into a cbbench result (compare, gate, report
    and export then read it)."""
    if tool not in TOOLS:
        raise UsageError(f"--from {tool!r}: use one of {', '.join(TOOLS)}")
    check_not_an_input(out, [file], "--out")
    if tool == aiperf.TOOL:
        recs = aiperf.records(aiperf.lines(file), str(file))
        result = build_result(aiperf.config(recs), None, recs, aiperf.duration_s(recs))
    else:
        data = read_json_file(file, f"{tool} result")
        if not isinstance(data, dict):
            raise UsageError(f"{file} is not a {tool} result (not a JSON object)")
        recs = vllm_bench.records(data, str(file))
        result = build_result(
            vllm_bench.config(data), vllm_bench.started_at(data), recs,
            vllm_bench.duration_s(data, recs),
        )
    write_result(out, result)
    typer.echo(f"imported {len(recs)} requests from {tool}: {out}")
