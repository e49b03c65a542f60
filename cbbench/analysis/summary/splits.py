"""An HTTP run's figures split by the model each request asked for (--lora-modules) and by the
endpoint it went to (several --endpoint URLs): summary.by_model and summary.by_endpoint, each
{key: {"completed", "failed", "request_throughput", "output_throughput", "ttft_ms", "tpot_ms",
"e2el_ms"}}, throughputs over the whole run's duration (so the parts add up to the run's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.metrics import DEFAULT_PERCENTILES, MS, distribution


def split_by(records: Sequence[RequestRecord], key: Callable[[RequestRecord], str | None],
             duration_s: float, percentiles=DEFAULT_PERCENTILES) -> dict[str, dict]:
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        k = key(r)
        if k is not None:
            groups.setdefault(k, []).append(r)
    out = {}
    for k in sorted(groups):
        mine = groups[k]
        done = [r for r in mine if r.ok]
        out[k] = {
            "completed": len(done),
            "failed": sum(1 for r in mine if r.error is not None),
            "request_throughput": len(done) / duration_s if duration_s > 0 else None,
            "output_throughput": (
                sum(r.output_tokens for r in done) / duration_s if duration_s > 0 else None
            ),
            "ttft_ms": distribution([(r.token_times_s[0] - r.intended_start_s) * MS
                                     for r in done], percentiles),
            "tpot_ms": distribution([r.tpot_s * MS for r in done if r.tpot_s is not None],
                                    percentiles),
            "e2el_ms": distribution([(r.token_times_s[-1] - r.intended_start_s) * MS
                                     for r in done], percentiles),
        }
    return out


def add_splits(summary: dict, records: Sequence[RequestRecord], duration_s: float,
               percentiles=DEFAULT_PERCENTILES) -> None:
    """by_model when requests asked for more than one model, by_endpoint when they went to
    more than one URL; nothing for a run with one of each. ``percentiles``: the run's
    (--percentiles), as every latency distribution holds them."""
    for name, key in (("by_model", lambda r: r.model), ("by_endpoint", lambda r: r.endpoint)):
        split = split_by(records, key, duration_s, percentiles)
        if len(split) > 1:
            summary[name] = split
