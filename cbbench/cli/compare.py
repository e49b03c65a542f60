"""`cbbench compare`: results side by side, with ratios against the first.

Two modes: existing result files, or `--variants`, which runs each engine variant on the
identical request set (same workload, seed and arrivals) and saves DIR/<variant>.json.
The table model here (rows, ratios, config differences) is shared with `cbbench report`.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from tabulate import tabulate

from cbbench.cli import options as C
from cbbench.errors import UsageError

if TYPE_CHECKING:
    from cbbench.bench.runner import RunSpec
    from cbbench.engine.args import EngineArgs

# ---- the table model ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    label: str
    path: str  # dotted into `summary`
    digits: int = 2
    percent: bool = False


LATENCIES = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2EL", "e2el_ms"))
LATENCY_STATS = ("mean", "p50", "p99")
ROWS: tuple[Row, ...] = (
    Row("completed", "completed", 0),
    Row("failed", "failed", 0),
    Row("duration (s)", "duration_s", 3),
    Row("request throughput (req/s)", "request_throughput"),
    Row("output throughput (tok/s)", "output_throughput", 1),
    Row("total token throughput (tok/s)", "total_token_throughput", 1),
    Row("goodput (req/s)", "goodput"),
    *(
        Row(f"{label} {stat} (ms)", f"{key}.{stat}")
        for label, key in LATENCIES
        for stat in LATENCY_STATS
    ),
    Row("iterations", "engine.num_iterations", 0),
    Row("mean iteration (ms)", "engine.mean_iteration_ms", 3),
    Row("mean prefill tokens / iter", "engine.mean_prefill_tokens", 1),
    Row("mean decode tokens / iter", "engine.mean_decode_tokens", 1),
    Row("token budget use", "engine.token_budget_utilization", 1, percent=True),
    Row("mean running requests", "engine.mean_running", 1),
    Row("peak KV use", "engine.peak_kv_usage", 1, percent=True),
    Row("preemptions", "engine.num_preemptions", 0),
    Row("analytic bandwidth (GB/s)", "engine.mean_achieved_bw_gbps", 1),
    Row("analytic MBU", "engine.mbu", 1, percent=True),
)
# Config keys that differ between any two runs without saying anything about them.
NOISE_KEYS = frozenset({"command", "started_at"})
MISSING = "-"


@dataclasses.dataclass(frozen=True)
class Labeled:
    label: str
    result: dict


def summary_value(result: dict, path: str) -> float | None:
    """The number at a dotted path into `summary` (ints stay ints), or None."""
    node = result.get("summary", {})
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return node if math.isfinite(node) else None


def ratio(value: float | None, first: float | None) -> float | None:
    if value is None or first is None or first == 0:
        return None
    return value / first


def fmt_number(v: float | None, row: Row) -> str:
    if v is None:
        return MISSING
    if row.percent:
        return f"{v:.{row.digits}%}"
    return f"{v:,.{row.digits}f}"


def present_rows(results: Sequence[Labeled]) -> list[Row]:
    """The rows at least one result has a value for (goodput needs --slo, MBU a GPU peak)."""
    return [r for r in ROWS if any(summary_value(x.result, r.path) is not None for x in results)]


def table_rows(results: Sequence[Labeled]) -> list[list[str]]:
    """One row per metric: the first result's value, then each other's with its ratio."""
    out = []
    for row in present_rows(results):
        values = [summary_value(x.result, row.path) for x in results]
        cells = [fmt_number(values[0], row)]
        for v in values[1:]:
            r = ratio(v, values[0])
            cells.append(fmt_number(v, row) + (f" ({r:.2f}×)" if r is not None else ""))
        out.append([row.label, *cells])
    return out


def headers(results: Sequence[Labeled]) -> list[str]:
    marks = [" (interrupted)" if x.result.get("interrupted") else "" for x in results]
    return ["metric", *(x.label + m for x, m in zip(results, marks))]


def render_table(results: Sequence[Labeled], tablefmt: str = "simple") -> str:
    return tabulate(
        table_rows(results), headers=headers(results), tablefmt=tablefmt, disable_numparse=True
    )


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_differences(results: Sequence[Labeled]) -> list[list[str]]:
    """[key, value per result] for every config key whose values differ (nested keys
    dotted), plus the cbbench version; the command line and timestamps are left out."""
    flat = [
        {**_flatten(x.result.get("config", {})), "cbbench_version": x.result.get("cbbench_version")}
        for x in results
    ]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    absent = object()
    rows = []
    for k in keys:
        if k in NOISE_KEYS:
            continue
        values = [f.get(k, absent) for f in flat]
        if any(v != values[0] for v in values[1:]):
            rows.append([k, *("(absent)" if v is absent else str(v) for v in values)])
    return rows


def render_differences(results: Sequence[Labeled], tablefmt: str = "simple") -> str:
    rows = config_differences(results)
    if not rows:
        return "configs: identical"
    head = ["config", *(x.label for x in results)]
    return tabulate(rows, headers=head, tablefmt=tablefmt, disable_numparse=True)


def csv_text(results: Sequence[Labeled]) -> str:
    """Raw numbers, one row per metric: each result's value, then each ratio to the first."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    first = results[0].label
    w.writerow(
        ["metric", "path", *(x.label for x in results), *(f"{x.label}/{first}" for x in results[1:])]
    )
    for row in present_rows(results):
        values = [summary_value(x.result, row.path) for x in results]
        ratios = [ratio(v, values[0]) for v in values[1:]]
        w.writerow([row.label, row.path, *("" if v is None else repr(v) for v in [*values, *ratios])])
    return buf.getvalue()


def markdown_text(results: Sequence[Labeled]) -> str:
    parts = ["## cbbench compare", "", render_table(results, "github"), ""]
    diffs = config_differences(results)
    if diffs:
        parts += ["### Config differences", "", render_differences(results, "github"), ""]
    return "\n".join(parts)


def workload_note(results: Sequence[Labeled]) -> str | None:
    from cbbench.analysis.gate import WORKLOAD_KEYS

    first = results[0].result.get("config", {})
    keys = [
        k for k in WORKLOAD_KEYS
        if any(x.result.get("config", {}).get(k) != first.get(k) for x in results[1:])
    ]
    if not keys:
        return None
    return f"note: the results served different loads ({', '.join(keys)} differ): not like for like"


# ---- variants -------------------------------------------------------------------------------

# Batching axis: (scheduler, chunked prefill). Static batching runs without chunked prefill.
BATCHING = {
    "static": ("static", False),
    "continuous": ("continuous", False),
    "continuous-chunked": ("continuous", True),
}
KV_ALLOCATIONS = ("paged", "reserved")
# Policy axes: preemption mode, queue policy, prefix caching (name -> the option's value).
PREEMPTIONS = ("recompute", "swap")
QUEUE_POLICIES = ("fcfs", "priority")
PREFIX_CACHING = {"prefix-cache": True, "no-prefix-cache": False}
VARIANT_JOIN = "+"
# Inside results/runs/, which git ignores: variant runs are scratch, not baselines.
DEFAULT_OUT_PARENT = Path("results") / "runs"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    scheduler: str | None = None  # None: keep the command's --scheduler
    chunked_prefill: bool | None = None
    kv_allocation: str | None = None
    preemption: str | None = None
    policy: str | None = None
    enable_prefix_caching: bool | None = None

    def apply(self, opts: EngineArgs) -> EngineArgs:
        changes = {}
        if self.scheduler is not None:
            changes.update(scheduler=self.scheduler, chunked_prefill=self.chunked_prefill)
        for key in ("kv_allocation", "preemption", "policy", "enable_prefix_caching"):
            value = getattr(self, key)
            if value is not None:
                changes[key] = value
        return dataclasses.replace(opts, **changes)


def parse_variant(name: str) -> Variant:
    axes = (BATCHING, KV_ALLOCATIONS, PREEMPTIONS, QUEUE_POLICIES, PREFIX_CACHING)
    valid = (
        f"{', '.join(n for axis in axes for n in axis)} (combine one of each axis with "
        f"'{VARIANT_JOIN}', e.g. continuous-chunked+reserved or swap+priority+prefix-cache)"
    )
    chosen: list[str | None] = [None] * len(axes)
    for part in name.split(VARIANT_JOIN):
        axis = next((i for i, names in enumerate(axes) if part in names), None)
        if axis is None or chosen[axis] is not None:
            raise UsageError(f"invalid variant {name!r}: use {valid}")
        chosen[axis] = part
    batching, kv, preemption, policy, caching = chosen
    sched, chunked = BATCHING[batching] if batching else (None, None)
    return Variant(
        name,
        sched,
        chunked,
        kv,
        preemption,
        policy,
        PREFIX_CACHING[caching] if caching else None,
    )


def parse_variants(text: str) -> list[Variant]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise UsageError(f"--variants lists a variant twice: {text!r}")
    if len(names) < 2:
        raise UsageError("--variants needs two or more variants, e.g. static,continuous")
    return [parse_variant(n) for n in names]


# ---- the command ----------------------------------------------------------------------------


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)


@C.guard
@C.with_engine_options
def compare(
    files: Annotated[
        list[Path] | None, typer.Argument(help="Result files; the first is the reference.")
    ] = None,
    variants: Annotated[
        str | None,
        typer.Option(
            help="Run these variants on one request set instead: static, continuous, "
            "continuous-chunked | paged, reserved | recompute, swap | fcfs, priority | "
            "prefix-cache, no-prefix-cache; combine axes with '+'."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(help="--variants: folder for <variant>.json. Default: results/runs/compare-<time>."),
    ] = None,
    workload: Annotated[str, typer.Option(help="--variants: built-in workload or JSONL file.")] = "sharegpt",
    num_requests: Annotated[int | None, typer.Option(help="--variants: requests drawn with --seed.")] = None,
    seed: Annotated[int, typer.Option(help="--variants: seed for requests, arrivals, sampling.")] = 0,
    request_rate: Annotated[str, typer.Option(help="--variants: requests/s, or inf.")] = "inf",
    burstiness: Annotated[float, typer.Option(help="--variants: gamma shape; 1 = Poisson.")] = 1.0,
    arrival: Annotated[str, typer.Option(help="--variants: auto | gamma | constant | trace.")] = "auto",
    slo: Annotated[
        str | None, typer.Option(help="--variants: goodput SLOs in ms, e.g. ttft=500,tpot=50.")
    ] = None,
    save_detailed: Annotated[
        bool, typer.Option(help="--variants: store per-token times (ITL plots in report).")
    ] = False,
    markdown: Annotated[Path | None, typer.Option(help="Also write the table as Markdown.")] = None,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Also write the numbers and ratios as CSV.")
    ] = None,
    *,
    engine_opts: C.EngineArgs,
) -> None:
    """Compare results side by side (ratios against the first), or run --variants on one
    identical request set and compare those. A variant sets any of the batching (static,
    continuous, continuous-chunked), the KV allocation (paged, reserved), the preemption mode
    (recompute, swap), the queue policy (fcfs, priority) and prefix caching (prefix-cache,
    no-prefix-cache); the other engine options apply to every variant."""
    from cbbench.analysis.result import check_writable

    for path in (markdown, csv_out):
        if path is not None:
            check_writable(path)
    if variants is not None:
        if files:
            raise UsageError("give result files or --variants, not both")
        opts = engine_opts
        base = _base_spec(
            workload, num_requests, seed, request_rate, burstiness, arrival, slo, save_detailed, opts
        )
        folder = out_dir or DEFAULT_OUT_PARENT / _dt.datetime.now().strftime("compare-%Y%m%d-%H%M%S")
        results = run_variants(parse_variants(variants), base, folder)
    else:
        if not files or len(files) < 2:
            raise UsageError("compare needs two or more result files (or --variants)")
        results = load_labeled(files)

    typer.echo(render_table(results))
    typer.echo("")
    typer.echo(render_differences(results))
    note = workload_note(results)
    if note:
        typer.echo(f"\n{note}")
    if markdown is not None:
        from cbbench.analysis.result import write_atomic

        write_atomic(markdown, markdown_text(results))
    if csv_out is not None:
        from cbbench.analysis.result import write_atomic

        write_atomic(csv_out, csv_text(results))


def file_labels(files: Sequence[Path]) -> list[str]:
    """File stems, or the paths themselves where two stems collide."""
    stems = [p.stem for p in files]
    return stems if len(set(stems)) == len(stems) else [str(p) for p in files]


def load_labeled(files: Sequence[Path]) -> list[Labeled]:
    """Results labelled by their own ``--label`` where every one has a distinct label, else by
    file name."""
    from cbbench.analysis.result import load_result

    results = [load_result(p) for p in files]
    labels = [(r.get("config") or {}).get("label") for r in results]
    if not all(labels) or len(set(labels)) != len(labels):
        labels = file_labels(files)
    return [Labeled(lbl, r) for lbl, r in zip(labels, results)]


def _base_spec(
    workload: str,
    num_requests: int | None,
    seed: int,
    request_rate: str,
    burstiness: float,
    arrival: str,
    slo: str | None,
    save_detailed: bool,
    opts: EngineArgs,
) -> RunSpec:
    """The RunSpec every variant shares; only its engine options change per variant."""
    from cbbench.analysis.metrics import parse_slo
    from cbbench.bench.runner import DEFAULT_NUM_REQUESTS, RunSpec

    if not burstiness > 0 or not math.isfinite(burstiness):
        raise UsageError(f"--burstiness must be a positive number, got {burstiness}")
    return RunSpec(
        workload=workload,
        num_requests=num_requests if num_requests is not None else DEFAULT_NUM_REQUESTS,
        seed=seed,
        request_rate=C.parse_rate_option(request_rate),
        rate_given=request_rate != "inf",
        burstiness=burstiness,
        arrival=arrival,
        slo=parse_slo(slo),
        save_detailed=save_detailed,
        engine=opts,
    )


def run_variants(variants: Sequence[Variant], base: RunSpec, folder: Path) -> list[Labeled]:
    """Run each variant on the base spec's request set; each result is saved as soon as it
    is done, so an interrupted comparison keeps the variants that finished."""
    from cbbench.analysis.result import check_writable, write_result
    from cbbench.bench.runner import execute_run

    paths = [folder / f"{v.name}.json" for v in variants]
    for p in paths:
        check_writable(p)
    results = []
    for i, (v, path) in enumerate(zip(variants, paths), 1):
        C.notice(f"variant {v.name} ({i}/{len(variants)})")
        result = execute_run(dataclasses.replace(base, engine=v.apply(base.engine)), C.notice)
        write_result(path, result)
        C.notice(f"saved {path}")
        results.append(Labeled(v.name, result))
    return results
