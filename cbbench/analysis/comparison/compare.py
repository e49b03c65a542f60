"""Results side by side: the comparison table (each metric, with ratios against the first
result), the config keys that differ, and a note when the results served different loads. Used by
`cbbench compare` and `cbbench report`."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from cbbench.analysis.comparison.gate import WORKLOAD_KEYS
from cbbench.analysis.result import clean_text
from cbbench.schema import RunResult, as_run, read_run, to_dict
from cbbench.schema.base import field_of


@dataclasses.dataclass(frozen=True)
class Row:
    label: str
    path: str  # dotted into `summary`
    digits: int = 2
    percent: bool = False
    # A latency row is shown even where no result has its value (ITL p99.9 of runs without
    # --save-detailed): its "-" says the percentile could not be computed, where a dropped row
    # read as if it had not been asked for (docs/metrics.md, "Percentiles you choose").
    always: bool = False


LATENCIES = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2EL", "e2el_ms"))
LATENCY_STATS = ("mean", "p50", "p99")


def rows_for(stats: Sequence[str] = LATENCY_STATS) -> tuple[Row, ...]:
    """The table's rows, the latencies at ``stats`` (compare --percentiles)."""
    return (*HEAD_ROWS, *(Row(f"{label} {stat} (ms)", f"{key}.{stat}", always=True)
                          for label, key in LATENCIES for stat in stats), *ENGINE_ROWS)


HEAD_ROWS: tuple[Row, ...] = (
    Row("completed", "completed", 0),
    Row("failed", "failed", 0),
    # Requests the client gave up on (--cancel-rate): neither completed nor failed, so without
    # this row a run's completed and failed did not add up to its requests.
    Row("cancelled", "cancelled", 0),
    Row("duration (s)", "duration_s", 3),
    Row("request throughput (req/s)", "request_throughput"),
    Row("output throughput (tok/s)", "output_throughput", 1),
    Row("total token throughput (tok/s)", "total_token_throughput", 1),
    Row("goodput (req/s)", "goodput"),
)
ENGINE_ROWS: tuple[Row, ...] = (
    Row("iterations", "engine.num_iterations", 0),
    Row("mean iteration (ms)", "engine.mean_iteration_ms", 3),
    Row("mean prefill tokens / iter", "engine.mean_prefill_tokens", 1),
    Row("mean decode tokens / iter", "engine.mean_decode_tokens", 1),
    Row("output tokens / iter", "engine.mean_emitted_tokens", 1),
    Row("tokens / request step", "engine.tokens_per_request_step", 2),
    Row("spec. acceptance rate", "speculative.acceptance_rate", 1, percent=True),
    Row("spec. mean acceptance length", "speculative.mean_acceptance_length", 2),
    Row("token budget use", "engine.token_budget_utilization", 1, percent=True),
    Row("mean running requests", "engine.mean_running", 1),
    Row("peak KV use", "engine.peak_kv_usage", 1, percent=True),
    Row("preemptions", "engine.num_preemptions", 0),
    Row("analytic bandwidth (GB/s)", "engine.mean_achieved_bw_gbps", 1),
    Row("analytic MBU", "engine.mbu", 1, percent=True),
)
ROWS = rows_for()
# Config keys that differ between any two runs without saying anything about them.
NOISE_KEYS = frozenset({"command", "started_at"})
MISSING = "-"
RATIO_DIGITS = 3  # significant digits of a ratio below 1 (at and above 1: two decimals)


@dataclasses.dataclass(frozen=True)
class Labeled:
    """A result and the name a table shows it by. A dict given (a test's) is read as its
    model: every reader of ``result`` reads attributes."""

    label: str
    result: RunResult

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", as_run(self.result, self.label))


def summary_value(result: RunResult, path: str) -> float | None:
    """The number at a dotted path into `summary` (ints stay ints), or None."""
    from cbbench.analysis.summary.percentiles import split_metric_path

    node: object = result.summary
    for part in split_metric_path(path):
        node = field_of(node, part)
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return node if math.isfinite(node) else None


def ratio(value: float | None, first: float | None) -> float | None:
    if value is None or first is None or first == 0:
        return None
    return value / first


def fmt_ratio(r: float) -> str:
    """A ratio to the first result with at least RATIO_DIGITS significant digits: 2.00×, 0.00399×
    (two decimals printed a 250-fold drop as 0.00×)."""
    if r == 0 or not math.isfinite(r) or abs(r) >= 1:
        return f"{r:,.2f}×"
    decimals = RATIO_DIGITS - 1 - math.floor(math.log10(abs(r)))
    return f"{r:.{decimals}f}×"


def fmt_number(v: float | None, row: Row) -> str:
    if v is None:
        return MISSING
    if row.percent:
        return f"{v:.{row.digits}%}"
    return f"{v:,.{row.digits}f}"


def present_rows(results: Sequence[Labeled], rows: Sequence[Row] = ROWS) -> list[Row]:
    """The latency rows, and the other rows at least one result has a value for (goodput needs
    --slo, MBU a GPU peak); none without results (a report of sweeps only)."""
    if not results:
        return []
    return [r for r in rows
            if r.always or any(summary_value(x.result, r.path) is not None for x in results)]


def table_rows(results: Sequence[Labeled], rows: Sequence[Row] = ROWS) -> list[list[str]]:
    """One row per metric: the first result's value, then each other's with its ratio."""
    out = []
    for row in present_rows(results, rows):
        values = [summary_value(x.result, row.path) for x in results]
        cells = [fmt_number(values[0], row)]
        for v in values[1:]:
            r = ratio(v, values[0])
            cells.append(fmt_number(v, row) + (f" ({fmt_ratio(r)})" if r is not None else ""))
        out.append([row.label, *cells])
    return out


def headers(results: Sequence[Labeled]) -> list[str]:
    marks = [" (interrupted)" if x.result.interrupted else "" for x in results]
    return ["metric", *(x.label + m for x, m in zip(results, marks))]


def render_table(results: Sequence[Labeled], tablefmt: str = "simple",
                 rows: Sequence[Row] = ROWS) -> str:
    return tabulate(
        table_rows(results, rows), headers=headers(results), tablefmt=tablefmt,
        disable_numparse=True,
    )


def _flatten(d: dict, prefix: str = "", empty: set[str] | None = None) -> dict:
    """A nested dict's leaves under dotted keys. An empty dict (a run without --slo has
    ``slo: {}``) is no leaf: its key goes into ``empty``, so that the other run's ``slo.ttft``
    reads "(none)" beside it, not ``slo`` {} against "(absent)" and ``slo.ttft`` "(absent)"."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + ".", empty))
        elif isinstance(v, dict):
            if empty is not None:
                empty.add(key)
        else:
            out[key] = v
    return out


def _missing(key: str, empty: set[str]) -> str:
    """How a config key a result lacks is shown: "(none)" where the result has the dict that
    would hold it, empty (no SLO limits at all), else "(absent)" (an older file, an option
    that did not exist)."""
    parts = key.split(".")
    held = any(".".join(parts[:i]) in empty for i in range(1, len(parts) + 1))
    return "(none)" if held else "(absent)"


CONFIG_FLOAT_DIGITS = 6  # significant digits of a config float as shown: 1e-05, 9.89e+14


def config_text(v: object) -> str:
    """A config value as a table shows it: a float to CONFIG_FLOAT_DIGITS significant digits
    (1e-05, not its binary 9.999999999999999e-06), anything else as written."""
    if isinstance(v, float):
        return f"{v:.{CONFIG_FLOAT_DIGITS}g}"
    return str(v)


def config_differences(results: Sequence[Labeled]) -> list[list[str]]:
    """[key, value per result] for every config key whose values differ (nested keys
    dotted), plus the cbbench version; the command line and timestamps are left out."""
    empties: list[set[str]] = [set() for _ in results]
    flat = [{**_flatten(to_dict(x.result.config), empty=empty),
             "cbbench_version": x.result.cbbench_version}
            for x, empty in zip(results, empties, strict=True)]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    absent = object()
    rows = []
    for k in keys:
        if k in NOISE_KEYS:
            continue
        values = [f.get(k, absent) for f in flat]
        if any(v != values[0] for v in values[1:]):
            rows.append([k, *(_missing(k, empty) if v is absent else config_text(v)
                              for v, empty in zip(values, empties, strict=True))])
    return rows


def render_differences(results: Sequence[Labeled], tablefmt: str = "simple") -> str:
    rows = config_differences(results)
    if not rows:
        return "configs: identical"
    head = ["config", *(x.label for x in results)]
    return tabulate(rows, headers=head, tablefmt=tablefmt, disable_numparse=True)


def csv_text(results: Sequence[Labeled], rows: Sequence[Row] = ROWS) -> str:
    """Raw numbers, one row per metric: each result's value, then each ratio to the first."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    first = results[0].label
    w.writerow(
        ["metric", "path", *(x.label for x in results), *(f"{x.label}/{first}" for x in results[1:])]
    )
    for row in present_rows(results, rows):
        values = [summary_value(x.result, row.path) for x in results]
        ratios = [ratio(v, values[0]) for v in values[1:]]
        w.writerow([row.label, row.path, *("" if v is None else repr(v) for v in [*values, *ratios])])
    return buf.getvalue()


def markdown_text(results: Sequence[Labeled], rows: Sequence[Row] = ROWS) -> str:
    parts = ["## cbbench compare", "", render_table(results, "github", rows), ""]
    diffs = config_differences(results)
    if diffs:
        parts += ["### Config differences", "", render_differences(results, "github"), ""]
    return "\n".join(parts)


def workload_note(results: Sequence[Labeled]) -> str | None:
    first = results[0].result.config
    keys = [
        k for k in WORKLOAD_KEYS
        if any(field_of(x.result.config, k) != field_of(first, k) for x in results[1:])
    ]
    notes = []
    if keys:
        notes.append(f"note: the results served different loads ({', '.join(keys)} differ): "
                     "not like for like")
    first_summary = results[0].result.summary
    if any(x.result.summary.slo != first_summary.slo for x in results[1:]):
        notes.append("note: the results were held to different SLOs (summary.slo): their "
                     "goodput and SLO attainment do not compare")
    elif any(x.result.summary.slo_basis != first_summary.slo_basis for x in results[1:]):
        notes.append("note: the results judged their SLO on different bases (summary.slo_basis: "
                     "TTFT and E2EL from the send under a concurrency cap, else from the "
                     "intended start): their goodput and SLO attainment do not compare")
    return "\n".join(notes) or None


# ---- loading ----------------------------------------------------------------------------------
# The default rows' percentiles (LATENCY_STATS: 50, 99).
ROW_PERCENTILES = tuple(int(s[1:]) for s in LATENCY_STATS if s.startswith("p"))


def with_percentiles(results: Sequence[Labeled], percentiles: Sequence[float] | None
                     ) -> tuple[list[Labeled], tuple[Row, ...]]:
    """Each result with the percentiles its rows show, --percentiles or the default p50/p99,
    computed from its requests where it did not store them (a run with other --percentiles),
    and the rows that show them. Where they cannot be computed (ITL without --save-detailed)
    the cell stays '-'."""
    from cbbench.analysis.summary.percentiles import keys, with_percentiles_filled

    asked = ROW_PERCENTILES if percentiles is None else percentiles
    filled = [dataclasses.replace(x, result=with_percentiles_filled(x.result, asked, x.label))
              for x in results]
    return filled, ROWS if percentiles is None else rows_for(("mean", *keys(percentiles)))


def file_labels(files: Sequence[Path]) -> list[str]:
    """File stems, or the paths themselves where two stems collide; a name's non-UTF-8 bytes
    as U+FFFD (a label is drawn and written: neither takes a lone surrogate)."""
    stems = [clean_text(p.stem) for p in files]
    return stems if len(set(stems)) == len(stems) else [clean_text(str(p)) for p in files]


def load_labeled(files: Sequence[Path]) -> list[Labeled]:
    """Results labelled by their own ``--label`` where every one has a distinct label, else by
    file name."""
    results = [read_run(p) for p in files]
    given = [r.config.label for r in results]
    labels = [lbl for lbl in given if lbl]
    if len(labels) != len(given) or len(set(labels)) != len(labels):
        labels = file_labels(files)
    return [Labeled(lbl, r) for lbl, r in zip(labels, results)]
