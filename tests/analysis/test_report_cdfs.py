"""The report's latency CDFs (report.html's plotly traces and latency_cdfs.png's lines) hold the
values the summary's percentiles are computed from: completed requests only."""

from __future__ import annotations

import numpy as np
import pytest

from cbbench.analysis.comparison.compare import Labeled
from cbbench.report import interactive, plots


def _request(i: int, itl: list[float], **kw) -> dict:
    return {"id": i, "prompt_tokens": 8, "output_tokens": len(itl) + 1, "intended_start_s": 0.0,
            "ttft_ms": 10.0, "tpot_ms": float(np.mean(itl)), "e2el_ms": 10.0 + sum(itl),
            "itl_ms": itl, **kw}


def test_itl_cdf_leaves_out_cancelled_and_failed_requests_as_the_summary_does():
    # A --cancel-rate 0.3 run: the ITL CDF pooled the cancelled requests' gaps (4,197 where the
    # summary's ITL count was 4,117), its 0.99 crossing at 4.43 ms beside the table's p99 5.09.
    done = [_request(0, [4.0, 5.0]), _request(1, [6.0])]
    cancelled = {"id": 2, "prompt_tokens": 8, "output_tokens": 3, "intended_start_s": 0.0,
                 "cancelled": True, "itl_ms": [90.0, 95.0]}
    failed = {"id": 3, "prompt_tokens": 8, "output_tokens": 2, "intended_start_s": 0.0,
              "error": "timeout", "itl_ms": [80.0]}
    run = {"schema_version": 1, "config": {}, "summary": {},
           "requests": [*done, cancelled, failed]}
    gaps = [4.0, 5.0, 6.0]
    fig = interactive.latency_cdfs([Labeled("r", run)]).figure
    itl = next(t for t in fig["data"] if t["xaxis"] == "x3")
    assert itl["x"] == gaps and itl["y"] == pytest.approx([1 / 3, 2 / 3, 1.0])
    png = plots.latency_cdfs([Labeled("r", run)])
    line = next(ax for ax in png.axes if ax.get_xlabel() == "ITL (ms)").lines[0]
    x, y = line.get_xydata().T
    assert x.tolist() == gaps and y.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_a_summary_only_result_is_told_why_its_plots_are_missing():
    # A --summary-only result's page said "No throughput and latency over time plot: ... (an
    # endpoint run has no engine iterations)": that plot reads requests, and the run had an engine.
    run = {"schema_version": 1, "config": {}, "summary": {}}
    _, notes = interactive.build_plots([Labeled("r", run)], 10, None)
    over_time = next(n for n in notes if "over time" in n)
    assert "endpoint" not in over_time and "per-request records" in over_time
    budget = next(n for n in notes if "token budget" in n)
    assert "per-iteration records" in budget
    assert any(n.startswith("No KV cache use plot") for n in notes)


def test_the_static_pages_notes_name_what_each_result_lacks():
    # report-static.html told a --summary-only result to "run with --save-detailed" (it keeps no
    # requests at all) and promised an endpoint run "only the analytic line is drawn" (it has no
    # iterations, so no analytic line either).
    from cbbench.report.notes import section_notes

    summary_only = Labeled("s", {"schema_version": 1, "config": {}, "summary": {}})
    with_requests = Labeled("d", {"schema_version": 1, "config": {}, "summary": {},
                                  "requests": [{**_request(0, [4.0]), "itl_ms": None}]})
    cdf = section_notes("latency_cdfs", [summary_only, with_requests])
    assert any(n.startswith("No ITL line for d:") and "--save-detailed" in n for n in cdf)
    assert any(n.startswith("No latency lines for s:") and "--summary-only" in n for n in cdf)
    assert not any("s," in n or "for s:" in n and "--save-detailed" in n for n in cdf)
    bw = section_notes("bandwidth", [summary_only])
    assert bw and all("analytic line is drawn" not in n for n in bw)
    assert "neither GPU telemetry nor per-iteration records" in bw[0]


def test_report_html_says_why_a_summary_only_results_latency_panels_are_empty():
    # report.html drew a --summary-only result's ITL line from its histogram, kept the section
    # and left the TTFT, TPOT and E2EL panels empty with no word (the static page says why).
    run = {"schema_version": 1, "config": {}, "summary": {
        "itl_histogram": {"unit": "ms", "low_ms": 0.01, "bins_per_decade": 20, "below": 0,
                          "bins": [200, 210], "counts": [3, 1]}}}
    detailed = {"schema_version": 1, "config": {}, "summary": {}, "requests": [_request(0, [4.0])]}
    plots_, _ = interactive.build_plots([Labeled("s", run), Labeled("d", detailed)], 10, None)
    cdfs = next(p for p in plots_ if p.key == "latency_cdfs")
    assert any(n.startswith("No TTFT, TPOT or E2EL lines for s:") and "--summary-only" in n
               for n in cdfs.notes)
    assert not any("ITL" in n for n in cdfs.notes)  # both ITL lines are drawn
    page = interactive.render_interactive("t", [Labeled("s", run)], ["s.json"], [cdfs], [], "")
    assert "No TTFT, TPOT or E2EL lines for s:" in page
