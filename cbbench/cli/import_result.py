"""`cbbench import`: another tool's per-request output as a cbbench result.

  vllm-bench      `vllm bench serve --save-result --save-detailed`'s JSON
  aiperf          AIPerf's per-request records, profile_export.jsonl
  guidellm        GuideLLM's benchmarks JSON (one benchmark of it: --benchmark)
  inference-perf  inference-perf's per_request_lifecycle_metrics.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cbbench.analysis.input_file import check_input_file
from cbbench.cli import options as C
from cbbench.errors import UsageError

# The importers and the result models (numpy, pydantic) are imported where a file is imported,
# not at the top: `cbbench --help` registers every command (cli/app.py).


def register(app: typer.Typer) -> None:
    app.command("import")(import_result)


def import_result(
    file: Annotated[Path, typer.Argument(help="The other tool's result file.", metavar="FILE")],
    tool: Annotated[str, typer.Option(
        "--from", help="The tool that wrote it: vllm-bench | aiperf | guidellm | inference-perf.")],
    out: Annotated[
        Path, typer.Option("--out", parser=C.output_file, metavar="<path>",
                           help="The cbbench result JSON to write.")
    ],
    benchmark: Annotated[int | None, typer.Option(
        "--benchmark", metavar="INDEX",
        help="guidellm: which of the file's benchmarks (0-based; a sweep writes several). "
        "Default: the only one.")] = None,
    same_host: Annotated[bool, typer.Option(
        "--same-host",
        help="vllm-bench: the file was written on this host since its last boot. vLLM times on "
        "perf_counter (this host's monotonic clock); this puts its times on the Unix clock, so "
        "`cbbench audit` compares them with a server log on one clock. Checked against the "
        "file's date.")] = False,
) -> None:
    """Turn another tool's per-request output into a cbbench result (compare, gate, report
    and export then read it)."""
    from cbbench.analysis.result import check_not_an_input, write_result
    from cbbench.importers import guidellm, vllm_bench

    tools = _tools()
    if tool not in tools:
        raise UsageError(f"--from {tool!r}: use one of {', '.join(tools)}")
    check_not_an_input(out, [file], "--out")
    if benchmark is not None and tool != guidellm.TOOL:
        raise UsageError("--benchmark picks one of a GuideLLM file's benchmarks: it needs "
                         "--from guidellm")
    if same_host and tool != vllm_bench.TOOL:
        raise UsageError(f"--same-host is for vllm-bench's perf_counter times: {tool} times on "
                         "the Unix clock already")
    result, recs = _read(file, tool, benchmark, same_host)
    write_result(out, result)
    typer.echo(f"imported {len(recs)} requests from {tool}: {out}")


# What an importer's parsing raises on a file of the right kind but the wrong shapes (a list
# where an object belongs, a dict as a name): one line naming the file, never a traceback.
MALFORMED = (TypeError, KeyError, AttributeError, IndexError, ValueError, OverflowError,
             RecursionError)


def _tools() -> tuple[str, ...]:
    from cbbench.importers import aiperf, guidellm, inference_perf, vllm_bench

    return (vllm_bench.TOOL, aiperf.TOOL, guidellm.TOOL, inference_perf.TOOL)


def _read(file: Path, tool: str, benchmark: int | None, same_host: bool = False):
    """(result, records): parsed, every record held to a measured record's rules, the result
    to the run schema; UsageError (one line) for anything else."""
    from cbbench.importers.checks import check_records, check_result
    from cbbench.importers.result import build_result

    check_input_file(file, f"{tool} result")  # a FIFO hung, /dev/zero was read without end
    try:
        config, started, recs, duration, t0, basis = _parse(file, tool, benchmark, same_host)
        check_records(recs, duration, str(file))
        result = build_result(config, started, recs, duration, t0, basis)
    except UsageError:
        raise
    except MemoryError:
        raise UsageError(f"{file}: the {tool} file asks for more memory than this host has: "
                         "its counts are not a run's") from None
    except MALFORMED as e:
        raise UsageError(f"{file} is not a {tool} result cbbench can read "
                         f"({type(e).__name__}: {str(e)[:120]})") from None
    return check_result(result, str(file)), recs


def _parse(file: Path, tool: str, benchmark: int | None, same_host: bool):
    """(config, started_at, records, duration_s, t0_epoch_s, latency_basis) of the tool's
    file (latency_basis None: the result's own, from the intended start)."""
    from cbbench.analysis.result import read_json_file
    from cbbench.importers import aiperf, guidellm, inference_perf, vllm_bench
    from cbbench.importers.fields import base_config, duration_s

    if tool == aiperf.TOOL:
        rows = aiperf.lines(file)
        recs = aiperf.records(rows, str(file))
        origin = aiperf.origin(rows)
        return (base_config(aiperf.TOOL, len(recs)), aiperf.started_at(origin), recs,
                duration_s(recs), origin, None)
    data = read_json_file(file, f"{tool} result")
    if tool == inference_perf.TOOL:
        entries = inference_perf.entries(data, str(file))
        recs = inference_perf.records(entries, str(file))
        return (inference_perf.config(recs), None, recs,
                inference_perf.duration_s(entries, recs), None, None)
    if not isinstance(data, dict):
        raise UsageError(f"{file} is not a {tool} result (not a JSON object)")
    if tool == guidellm.TOOL:
        bench = guidellm.benchmark(data, str(file), benchmark)
        recs = guidellm.records(bench, str(file))
        return (guidellm.config(data, bench, recs), guidellm.started_at(bench), recs,
                duration_s(recs, bench.duration), guidellm.origin(bench, str(file)),
                guidellm.latency_basis(bench))
    vllm = vllm_bench.VllmBenchFile.model_validate(data)
    recs = vllm_bench.records(vllm, str(file))
    t0 = vllm_bench.origin(vllm, str(file)) if same_host else None
    return (vllm_bench.config(vllm), vllm_bench.started_at(vllm, t0), recs,
            duration_s(recs, vllm.duration), t0, None)
