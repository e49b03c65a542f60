"""The report's single self-contained HTML page: inline CSS, plots embedded as base64 PNG data
URIs, no scripts and no external references, so it can be mailed or attached to a CI run."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from tabulate import tabulate

from cbbench.analysis.comparison.compare import ROWS, Labeled, Row, config_differences, table_rows
from cbbench.schema.coerce import as_run

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1150px; color: #222; padding: 0 1em; }
h1 { margin-bottom: 0.2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f2f2f2; }
img { max-width: 100%; border: 1px solid #ddd; }
.note { color: #8a5300; background: #fff6e5; padding: 0.4em 0.8em; border-left: 3px solid #e6862a; }
.caption { color: #555; font-size: 0.92em; }
section { margin: 2em 0; }
"""


@dataclass
class PlotSection:
    key: str  # also the PNG's file stem
    title: str
    caption: str
    png: bytes
    notes: list[str] = field(default_factory=list)


def _table(rows: list[list[str]], headers: list[str]) -> str:
    # tabulate's html format escapes every cell.
    return tabulate(rows, headers=headers, tablefmt="html", disable_numparse=True)


def _esc(text: object) -> str:
    return html.escape(str(text))


def runs_table(results: Sequence[Labeled], paths: Sequence[str]) -> str:
    headers = ["run", "file", "workload", "requests", "engine", "model", "GPU", "scheduler",
               "chunked prefill", "KV", "interrupted"]
    rows = []
    for x, path in zip(results, paths):
        run = as_run(x.result)
        c = run.config
        fields = c.model_fields_set  # written fields: a null engine is shown as null
        engine = (c.engine_kind if "engine_kind" in fields
                  else c.engine if "engine" in fields else c.target)
        rows.append([
            x.label, path, c.workload, c.num_requests, engine, c.model, c.gpu,
            c.scheduler, c.chunked_prefill, c.kv_allocation,
            "yes" if run.interrupted else "no",
        ])
    return _table([["-" if v is None else str(v) for v in r] for r in rows], headers)


def summary_table(results: Sequence[Labeled], rows: Sequence[Row] = ROWS) -> str:
    head = ["metric", *(x.label for x in results)]
    return _table(table_rows(results, rows), head)


def differences_table(results: Sequence[Labeled]) -> str:
    rows = config_differences(results)
    if not rows:
        return "<p>The configs are identical.</p>"
    return _table(rows, ["config", *(x.label for x in results)])


def plot_section(s: PlotSection) -> str:
    data = base64.b64encode(s.png).decode("ascii")
    notes = "".join(f'<p class="note">{_esc(n)}</p>' for n in s.notes)
    return (
        f'<section id="{_esc(s.key)}">\n<h2>{_esc(s.title)}</h2>\n'
        f'<p class="caption">{_esc(s.caption)}</p>\n{notes}\n'
        f'<img src="data:image/png;base64,{data}" alt="{_esc(s.title)}" '
        f'data-file="{_esc(s.key)}.png">\n</section>'
    )


def render_page(
    title: str,
    results: Sequence[Labeled],
    paths: Sequence[str],
    sections: Sequence[PlotSection],
    notes: Sequence[str] = (),
    rows: Sequence[Row] = ROWS,
) -> str:
    toc = "".join(f'<li><a href="#{_esc(s.key)}">{_esc(s.title)}</a></li>' for s in sections)
    ratio_hint = (
        f"Ratios are against the first run, {results[0].label}." if len(results) > 1 else ""
    )
    body = [
        f"<h1>{_esc(title)}</h1>",
        *(f'<p class="note">{_esc(n)}</p>' for n in notes),
        "<h2>Runs</h2>",
        runs_table(results, paths),
        "<h2>Summary</h2>",
        f'<p class="caption">{_esc(ratio_hint)}</p>',
        f'<div id="summary-table">{summary_table(results, rows)}</div>',
    ]
    if len(results) > 1:
        body += ["<h2>Config differences</h2>", differences_table(results)]
    body += [f"<h2>Plots</h2><ul>{toc}</ul>", *(plot_section(s) for s in sections)]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{_esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
