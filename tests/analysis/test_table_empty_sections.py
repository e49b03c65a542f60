"""A section the file wrote as ``{}`` prints as if absent (issue 36: the tables read the
result model, which has no dict length to make an empty section falsy)."""

from __future__ import annotations

from cbbench.analysis.table import render_summary

RESULT = {
    "config": {"target": "engine", "engine": "sim", "model": "m", "request_rate": "inf"},
    "summary": {"completed": 2, "failed": 0, "duration_s": 1.0, "request_throughput": 2.0,
                "output_throughput": 10.0, "total_token_throughput": 20.0,
                "ttft_ms": {"mean": 1.0, "p50": 1.0, "p99": 2.0, "count": 2},
                "by_turn": [{"turn": 1, "completed": 2}]},
}
# Every optional section whose model may be empty, as ``{}``.
EMPTY = ("engine", "steady_state", "speculative", "sessions", "images", "from_send",
         "client_bound", "short_outputs", "kv_transfer_ms", "request_bytes")


def test_an_empty_section_prints_as_an_absent_one():
    empty = {"config": RESULT["config"], "telemetry": {},
             "summary": {**RESULT["summary"], **{k: {} for k in EMPTY}}}
    assert render_summary(empty) == render_summary(RESULT)


def test_an_engine_section_with_some_figures_unknown_prints_them_as_dashes():
    """The schema lets mfu, the budget use and the peak KV use be null apart from mbu (a
    GPU with no FP32 peak, an older file): the table printed them with ``:.1%`` and raised
    TypeError, where every other unknown figure prints '-'."""
    engine = {"num_iterations": 3, "mean_iteration_ms": 1.0, "mbu": 0.5, "mfu": None,
              "token_budget_utilization": None, "peak_kv_usage": None, "mean_kv_usage": 0.1}
    text = render_summary({**RESULT, "summary": {**RESULT["summary"], "engine": engine}})
    assert "analytic MBU / MFU" in text and "50.0% / -" in text
    assert "peak / mean KV use" in text and "- / 10.0%" in text
