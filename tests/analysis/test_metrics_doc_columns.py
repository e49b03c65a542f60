"""docs/metrics.md says which columns the run table shows. It said "mean and those columns"
of the default --percentiles 50,90,95,99, but the table's default columns are mean, p50, p90,
p99 (analysis/table.py STATS; held byte for byte by tests/data/results/run_tables.txt), p95
only in the JSON. The doc names the table's own columns, read from the code here."""

from __future__ import annotations

from pathlib import Path

from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES, keys
from cbbench.analysis.table import STATS, latency_table
from cbbench.analysis.table_views import stats_of

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
