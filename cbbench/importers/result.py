"""An imported run as a cbbench result: the records through cbbench's own summary, so an
imported file is read like a run by compare, gate, report and export."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.result import base_result
from cbbench.analysis.server_side.ttft_breakdown import attach_parts, summarize_breakdown
from cbbench.analysis.summary.metrics import summarize
from cbbench.analysis.summary.splits import add_splits
from cbbench.analysis.summary.telemetry import unavailable
from cbbench.bench.runner import request_record_dict


def build_result(
    config: Mapping, started_at: str | None, records: Sequence[RequestRecord], duration_s: float,
    t0_epoch_s: float | None = None, latency_basis: str | None = None,
) -> dict:
    """``t0_epoch_s``: the records' zero on the Unix clock, for a tool that timed on it
    (GuideLLM, AIPerf): `cbbench audit` then compares them with the server log's times on one
    clock (exact when tool and server ran on one host, as a conformance run does).
    ``latency_basis``: what TTFT and E2EL count from where the importer chose the send as the
    intended start (``send``: a GuideLLM strategy with no arrival schedule)."""
    summary = summarize(records, duration_s)
    if latency_basis is not None:
        summary["latency_basis"] = latency_basis
    add_splits(summary, records, duration_s)  # by model (inference-perf's adapters)
    if t0_epoch_s is not None:
        summary["http"] = {"t0_epoch_s": float(t0_epoch_s)}
    # A tool that kept the server's per-request timings (vLLM bench, from a server with
    # --enable-per-request-metrics): the TTFT split a run makes from the same fields.
    if attach_parts(records, None, t0_epoch_s):
        summary.update(summarize_breakdown(records))
    return {
        **base_result(dict(config)),
        "started_at": started_at,
        "summary": summary,
        "telemetry": unavailable(f"imported from {config.get('imported_from')}"),
        # Detailed: the token times are all an imported request has; keep them.
        "requests": [request_record_dict(r, True) for r in records],
        "iterations": [],
    }
