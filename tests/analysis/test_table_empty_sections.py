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
