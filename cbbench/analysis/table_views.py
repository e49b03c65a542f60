"""The run table's issue-27 parts: the columns --percentiles asked for, the TTFT / E2EL split
(when the server told its side), and the time slices (--slice), read from the result's
models by attribute."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from cbbench.analysis.server_side.ttft_breakdown import E2EL_PARTS
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES, percentile_key, stats_shown
from cbbench.schema.coerce import as_model
from cbbench.schema.run import Config, Distribution, Summary

PART_LABELS = {
    "slot_wait_ms": "slot wait", "send_lag_ms": "send lag", "network_in_ms": "network in",
    "network_ms": "network (in + out)", "server_queue_ms": "server queue",
    "server_prefill_ms": "server prefill", "server_decode_ms": "server decode",
    "delivery_ms": "delivery",
}
SLICE_ROWS_SHOWN = 12  # the first slices; the result holds them all


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"


def stats_of(config: Config | dict, default: tuple[str, ...]) -> tuple[str, ...]:
    """The table's columns: the run's --percentiles, or the default ones."""
    asked = as_model(Config, config).percentiles
    if not asked or tuple(asked) == DEFAULT_PERCENTILES:
        return default
    return stats_shown(asked, default)


TAIL = "p99"  # the short views' tail percentile when the run asked for it (the default has it)


def tail_of(config: Config | dict | None) -> str:
    """The one tail percentile the short views show and label (the slice and by-turn tables,
    the steady-state and KV transfer lines, the report's time-slice plot): p99 where the
    run's --percentiles hold it (the default's do), else the highest it asked (p99.9 for
    50,99.9), the key its distributions were stored under."""
    asked = None if config is None else as_model(Config, config).percentiles
    if not asked or 99 in asked:
        return TAIL
    return percentile_key(max(asked))


def _stat(d: Distribution | None, stat: str) -> Any:
    return None if d is None else getattr(d, stat, None)


def breakdown_table(summary: Summary, stats: tuple[str, ...]) -> str:
    """TTFT and E2EL taken apart: each part's statistics (ms) and share of the whole."""
    out = []
    for title, b in (("TTFT", summary.ttft_breakdown), ("E2EL", summary.e2el_breakdown)):
        if not b:
            continue
        parts = [(name, part) for name in E2EL_PARTS
                 if (part := getattr(b, name, None)) is not None]
        rows = [[f"{PART_LABELS[name]} (ms)", *(_fmt(_stat(part, s)) for s in stats),
                 "-" if part.share is None else f"{part.share:.1%}"]
                for name, part in parts]
        table = tabulate(rows, headers=[f"{title} split", *stats, "share"], tablefmt="simple",
                         disable_numparse=True)
        note = (f"{b.requests} requests split ({', '.join(b.sources or [])}); {b.flagged} "
                f"flagged: parts off the whole by more than {b.tolerance_ms:g} ms")
        out.append(table + "\n" + note)
    return "\n\n".join(out)


def slices_table(summary: Summary, tail: str = TAIL) -> str:
    """The first slices, a row each; ``tail``: the TTFT tail column's percentile (tail_of)."""
    slices = summary.slices
    if not slices:
        return ""
    rows = [[f"{s.start_s:.1f}-{s.end_s:.1f}", s.completed, s.failed,
             _fmt(s.request_throughput), _fmt(s.output_throughput, 1),
             _fmt(_stat(s.ttft_ms, "p50")), _fmt(_stat(s.ttft_ms, tail)),
             _fmt(_stat(s.tpot_ms, "p50")), _fmt(s.in_flight, 1)]
            for s in slices[:SLICE_ROWS_SHOWN]]
    table = tabulate(rows, headers=["slice (s)", "done", "failed", "req/s", "tok/s", "TTFT p50",
                                    f"TTFT {tail}", "TPOT p50", "in flight"],
                     tablefmt="simple", disable_numparse=True)
    if len(slices) > SLICE_ROWS_SHOWN:
        table += f"\n({len(slices) - SLICE_ROWS_SHOWN} more slices: see summary.slices)"
    return table
