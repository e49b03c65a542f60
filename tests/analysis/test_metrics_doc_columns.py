"""docs/metrics.md says which columns the run table shows. It said "mean and those columns"
of the default --percentiles 50,90,95,99, but the table's default columns are mean, p50, p90,
p99 (analysis/table.py STATS; held byte for byte by tests/data/results/run_tables.txt), p95
only in the JSON. The doc names the table's own columns, read from the code here."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.metrics import summarize
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES, keys
from cbbench.analysis.table import STATS, latency_table
from cbbench.analysis.table_views import stats_of
from cbbench.load.arrivals import arrival_times
from cbbench.load.sessions import draw
from cbbench.load.synthetic import RandomSpec
from cbbench.load.workload_types import WorkloadRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _doc_text() -> str:
    return " ".join(DOC.read_text().split())


def test_the_doc_names_the_default_tables_columns():
    shown = stats_of({"percentiles": list(DEFAULT_PERCENTILES)}, STATS)
    header = latency_table({"ttft_ms": {"mean": 1.0, **{k: 1.0 for k in keys(DEFAULT_PERCENTILES)}}},
                           shown).splitlines()[0].split()
    assert tuple(header) == shown  # the table's own header
    text = _doc_text()
    assert f"default {','.join(f'{p:g}' for p in DEFAULT_PERCENTILES)}" in text
    assert f"under the default list, where it shows {', '.join(shown)}" in text
    left_out = [k for k in keys(DEFAULT_PERCENTILES) if k not in shown]
    assert left_out and all(f"{k} is in the JSON" in text for k in left_out)


def test_the_doc_states_each_difference_from_vllm_bench_serve_as_the_code_has_it():
    """docs/metrics.md said "Definitions follow vLLM's benchmark" and nothing of where they do
    not: ITL per token (vLLM's is per chunk), arrivals from t = 0 and not rescaled to N/rate,
    --length-range bounds without 100 x 1.1's float noise. Each stated figure is the code's,
    and the figure named as vLLM's is vLLM's formula (vllm/benchmarks/serve.py, datasets/)
    worked by hand."""
    text = _doc_text()
    assert "## Where `vllm bench serve` differs" in DOC.read_text()
    # A first chunk of 1 token at 0.5 s, then 2 tokens at 0.9 s, then 1 at 1.0 s: vLLM's ITL
    # is one gap per chunk, [0.4, 0.1] s; cbbench's itl_ms per token, [0.2, 0.2, 0.1] s.
    rec = RequestRecord(0, 10, 4, 0.0, send_s=0.0, token_times_s=[0.5, 0.9, 1.0],
                        event_tokens=[1, 2, 1])
    s = summarize([rec], 1.0)
    assert s["event_gap_ms"]["mean"] == pytest.approx(np.mean([400, 100]))
    assert s["itl_ms"]["mean"] == pytest.approx(np.mean([200, 200, 100]))
    assert "which is cbbench's `event_gap_ms`" in text
    # The first arrival at t = 0; the schedule not rescaled to end at N / rate.
    reqs = [WorkloadRequest(i, 10, 5) for i in range(40)]
    t = arrival_times(reqs, 20.0, 0.5, "gamma", seed=0)
    assert t[0] == 0.0 and t[-1] != pytest.approx(len(reqs) / 20.0)
    assert "the first request is sent at t = 0" in text
    # vLLM: ceil(100 * 1.1) = 111 by float noise; cbbench 110.
    assert math.ceil(100 * (1 + 0.1)) == 111
    assert RandomSpec(output_len=100, length_range=0.1).output_bounds() == (90, 110)
    assert "is 90-110 (vLLM: 90-111" in text
    # More requests than the workload has: all drawn with replacement.
    drawn, replaced = draw(list(range(3)), 6, seed=0, timed=False, source="", noun="")
    assert replaced and len(drawn) == 6
    assert "draws all N with replacement" in text
