"""The report's interactive page: one HTML file that opens offline, with plotly.js embedded
(no external reference), zoomable plots with hover, and the summary and compare tables.

Each figure is plotly JSON in its own ``<script type="application/json">`` block; a small
loader draws them and writes, into ``#cbbench-plot-check``, how many points each plot drew, so
a headless browser can tell that every plot has data (tests/analysis/test_report_browser.py).
A plot without data for any run is left out and the page says why.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbbench.analysis.comparison.compare import ROWS, Labeled, Row
from cbbench.analysis.summary.columns import RequestColumns
from cbbench.analysis.summary.histogram import cdf_points
from cbbench.report import plots
from cbbench.report.html import STYLE, differences_table, runs_table, summary_table
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Distribution, Iteration, RunResult

MS = 1000.0
# Enough points for a smooth line at any zoom a screen shows; keeps a 1M-token run's page small.
MAX_POINTS = 2000
TIME_BINS = 60  # throughput/latency over time: bins across the run
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
CHECK_ID = "cbbench-plot-check"


@dataclass
class Plot:
    key: str
    title: str
    caption: str
    figure: dict  # {"data": [...], "layout": {...}}
    notes: list[str] = dataclasses.field(default_factory=list)  # what it could not show

    @property
    def points(self) -> int:
        return sum(len(t.get("x") or ()) for t in self.figure["data"])


def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[list, list]:
    """At most MAX_POINTS points of a line: all of them, or, in each of MAX_POINTS / 2 buckets
    of consecutive points, its lowest and its highest, in order (first and last kept). Every
    peak and trough stays: evenly spaced points kept 64 of a run's 195 prefill iterations and
    drew its KV peak at 0.7544% beside a stored 0.7563%."""
    n = len(x)
    if n > MAX_POINTS:
        starts = np.linspace(0, n, MAX_POINTS // 2 + 1).round().astype(int)[:-1]
        # np.*.reduceat finds each bucket's extreme; the first point holding it is its index.
        lo, hi = np.fmin.reduceat(y, starts), np.fmax.reduceat(y, starts)  # NaN skipped
        bucket = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
        pos = np.arange(n)
        first_at = np.full(len(starts), n)
        keep = np.zeros(n, dtype=bool)
        for extreme in (lo, hi):
            hits = y == extreme[bucket]
            at = first_at.copy()
            np.minimum.at(at, bucket[hits], pos[hits])
            keep[at[at < n]] = True
        keep[[0, n - 1]] = True
        x, y = x[keep], y[keep]
    return [float(v) for v in x], [float(v) for v in y]


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values)
    return v, np.arange(1, len(v) + 1) / len(v)


def _itl_cdf(result: RunResult | dict) -> tuple[np.ndarray, np.ndarray] | None:
    run = as_run(result)
    exact = plots.itl_values(run)  # per-token gaps of a --save-detailed result
    if exact is not None and len(exact):
        return _cdf(exact)
    # An extra field of the summary (n36res types Summary): analysis/summary/histogram.py's dict.
    hist = (run.summary.model_extra or {}).get("itl_histogram")
    if isinstance(hist, dict) and hist.get("counts"):
        return cdf_points(hist)
    return None


def _stat(d: Distribution | None, stat: str) -> Any:
    """A distribution's pNN (an extra field: --percentiles names them), or None."""
    return (d.model_extra or {}).get(stat) if d is not None else None


def latency_cdfs(results: Sequence[Labeled]) -> Plot:
    panels = [("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", None), ("E2EL", "e2el_ms")]
    data = []
    layout = {"grid": {"rows": 2, "columns": 2, "pattern": "independent"}, "height": 640,
              "hovermode": "closest", "legend": {"orientation": "h"}}
    for p, (name, key) in enumerate(panels, 1):
        axis = "" if p == 1 else str(p)
        layout[f"xaxis{axis}"] = {"title": {"text": f"{name} (ms)"}, "type": "log"}
        layout[f"yaxis{axis}"] = {"title": {"text": "share ≤ x"}, "range": [0, 1.02]}
        for i, x in enumerate(results):
            if key is None:
                line = _itl_cdf(x.result)
            else:
                vals = plots.latency_values(x.result, key)
                line = _cdf(vals) if vals is not None and len(vals) else None
            if line is None:
                continue
            xs, ys = _thin(*line)
            data.append({
                "type": "scatter", "mode": "lines", "x": xs, "y": ys, "name": x.label,
                "legendgroup": x.label, "showlegend": p == 1, "line": {"color": _color(i)},
                "xaxis": f"x{axis}", "yaxis": f"y{axis}",
                "hovertemplate": f"{name} %{{x:.2f}} ms: %{{y:.1%}}<extra>{html.escape(x.label)}</extra>",
            })
    return Plot("latency_cdfs", "Latency CDFs",
                "Share of requests (ITL: of token gaps) at or below each latency; zoom with the "
                "mouse, double-click to reset. ITL is drawn from the per-token gaps with "
                "--save-detailed, else from the result's compact ITL histogram (12% bins).",
                {"data": data, "layout": layout})


def _token_columns(run: RunResult) -> RequestColumns:
    """A stored run's requests as the summary's columns, so its output tokens are counted by
    the one rule the slices and the steady window count them by (RaggedTokens: each stream
    event by its tokens, at its time). A request stored without token times (no
    --save-detailed) has its first token at its TTFT and the rest spread evenly to its last
    token, at its TPOT: what the file says of when they came."""
    from cbbench.analysis.records import RequestRecord
    from cbbench.analysis.summary.columns import request_columns

    records = []
    for r in run.requests or []:
        start, n = r.intended_start_s, r.output_tokens or 0
        times = [float(t) for t in r.token_times_s or []]
        if not times and start is not None and r.ttft_ms is not None and n > 0:
            last = start + (r.e2el_ms if r.e2el_ms is not None else r.ttft_ms) / MS
            times = np.linspace(start + r.ttft_ms / MS, last, n).tolist()
        records.append(RequestRecord(
            id=0, prompt_tokens=r.prompt_tokens or 0, output_tokens=n,
            intended_start_s=float(start or 0.0), token_times_s=times, error=r.error,
            cancelled=bool(r.cancelled),
            event_tokens=r.event_tokens if r.token_times_s else None))
    return request_columns(records)


def over_time(results: Sequence[Labeled]) -> Plot:
    data = []
    layout = {"grid": {"rows": 2, "columns": 1, "pattern": "independent"}, "height": 560,
              "xaxis": {"title": {"text": "time (s)"}}, "yaxis": {"title": {"text": "output tok/s"}},
              "xaxis2": {"title": {"text": "time (s)"}},
              "yaxis2": {"title": {"text": "TTFT p50 of requests finished (ms)"}},
              "legend": {"orientation": "h"}}
    for i, x in enumerate(results):
        run = as_run(x.result)
        ends = [(r.intended_start_s + r.e2el_ms / MS, r) for r in run.requests or []
                if r.e2el_ms is not None and r.intended_start_s is not None]
        if not ends:
            continue
        end = np.array([e for e, _ in ends])
        ttft = np.array([r.ttft_ms or 0.0 for _, r in ends])
        edges = np.linspace(0.0, float(end.max()) or 1.0, TIME_BINS + 1)
        width = edges[1] - edges[0]
        which = np.clip(np.searchsorted(edges, end, side="right") - 1, 0, TIME_BINS - 1)
        # Each token in the bin it streamed in (was: every token of a request at its end,
        # a 4,872 tok/s peak where 1,643 tok/s streamed).
        cols = _token_columns(run)
        tokens = cols.tokens.slice_tokens(np.flatnonzero(cols.ok), edges[1:-1], TIME_BINS)
        rate = tokens / width
        mids = (edges[:-1] + edges[1:]) / 2
        p50 = [float(np.median(ttft[which == b])) if (which == b).any() else None
               for b in range(TIME_BINS)]
        data.append({"type": "scatter", "mode": "lines", "x": mids.tolist(), "y": rate.tolist(),
                     "name": x.label, "legendgroup": x.label, "line": {"color": _color(i)}})
        data.append({"type": "scatter", "mode": "lines+markers", "x": mids.tolist(), "y": p50,
                     "name": x.label, "legendgroup": x.label, "showlegend": False,
                     "line": {"color": _color(i)}, "xaxis": "x2", "yaxis": "y2"})
    return Plot("over_time", "Throughput and latency over time",
                f"Output tokens per second in each of {TIME_BINS} slices of the run, each token "
                "counted when it streamed (as the time slices count them; a result without "
                "--save-detailed's token times: its tokens spread evenly from the first to the "
                "last), and the TTFT median of the requests that finished in each slice.",
                {"data": data, "layout": layout})


def time_slices(results: Sequence[Labeled]) -> Plot:
    """summary.slices (run --slice): each slice's output throughput, TTFT p50 and tail (each
    run's own: tail_of, p99 unless its --percentiles left 99 out) and in-flight requests, one
    point per slice at its middle."""
    from cbbench.analysis.table_views import tail_of

    data = []
    tails: list[str] = []  # each drawn run's tail percentile, in order, once
    layout = {"grid": {"rows": 3, "columns": 1, "pattern": "independent"}, "height": 720,
              "legend": {"orientation": "h"}, "xaxis3": {"title": {"text": "time (s)"}},
              "yaxis": {"title": {"text": "output tok/s"}},
              "yaxis2": {"title": {"text": "TTFT (ms)"}},
              "yaxis3": {"title": {"text": "in flight"}}}
    for i, x in enumerate(results):
        run = as_run(x.result)
        slices = run.summary.slices or []
        if not slices:
            continue
        tail = tail_of(run.config)
        tails += [] if tail in tails else [tail]
        mids = [(s.start_s + s.end_s) / 2 for s in slices]
        common: dict[str, Any] = {"type": "scatter", "mode": "lines+markers", "x": mids,
                                  "legendgroup": x.label}
        data.append({**common, "y": [s.output_throughput for s in slices], "name": x.label,
                     "line": {"color": _color(i)}})
        for stat, dash in (("p50", "solid"), (tail, "dot")):
            data.append({**common, "y": [_stat(s.ttft_ms, stat) for s in slices],
                         "name": f"{x.label} TTFT {stat}", "showlegend": False,
                         "line": {"color": _color(i), "dash": dash}, "xaxis": "x2", "yaxis": "y2"})
        data.append({**common, "y": [s.in_flight for s in slices], "showlegend": False,
                     "name": x.label, "line": {"color": _color(i)}, "xaxis": "x3", "yaxis": "y3"})
    tail_text = " / ".join(tails or ["p99"])
    if len(tails) > 1:
        tail_text += " (each run's tail percentile: hover names it)"
    return Plot("time_slices", "Time slices",
                f"Per --slice slice: output tokens per second, TTFT p50 (solid) and {tail_text} "
                "(dotted) of the requests that ended in it, and the mean requests in flight.",
                {"data": data, "layout": layout})


def ttft_breakdown(results: Sequence[Labeled]) -> Plot:
    """summary.ttft_breakdown: each part's mean, stacked, one bar per run."""
    from cbbench.analysis.table_views import PART_LABELS

    data = []
    for name, label in PART_LABELS.items():
        xs, ys = [], []
        for x in results:
            b = as_run(x.result).summary.ttft_breakdown
            # A part by its field name (PART_LABELS holds Breakdown's part fields).
            part = getattr(b, name, None) if b is not None else None
            if isinstance(part, Distribution) and part.mean is not None:
                xs.append(x.label)
                ys.append(part.mean)
        if xs:
            data.append({"type": "bar", "x": xs, "y": ys, "name": label,
                         "hovertemplate": f"{label} %{{y:.2f}} ms<extra>%{{x}}</extra>"})
    return Plot("ttft_breakdown", "Where TTFT went",
                "Mean of each part of the TTFT, from the intended start to the first token read: "
                "send lag, the way in, the server's queue and prefill, and delivery (network: "
                "both trips together, where the server's log was not given).",
                {"data": data, "layout": {"barmode": "stack", "height": 420,
                                          "yaxis": {"title": {"text": "ms"}}}})


IterationField = Callable[[Iteration], float | None]


def _iteration_series(results: Sequence[Labeled], fields: Sequence[tuple[IterationField, str]],
                      ytitle: str, scale=None) -> dict:
    data = []
    for i, x in enumerate(results):
        its = as_run(x.result).iterations or []
        if not its:
            continue
        t = np.array([it.start_s for it in its])
        for j, (field, name) in enumerate(fields):
            y = np.array([float(field(it) or 0) for it in its])
            if scale is not None:
                y = scale(its, y)
            xs, ys = _thin(t, y)
            data.append({"type": "scatter", "mode": "lines", "x": xs, "y": ys,
                         "name": f"{x.label}: {name}", "line": {"color": _color(i),
                         "dash": ("solid", "dot", "dash")[j % 3]}})
    return {"data": data, "layout": {"height": 420, "xaxis": {"title": {"text": "time (s)"}},
                                     "yaxis": {"title": {"text": ytitle}},
                                     "legend": {"orientation": "h"}}}


def token_budget(results: Sequence[Labeled]) -> Plot:
    fig = _iteration_series(
        results, [(lambda it: it.num_prefill_tokens, "prefill tokens"),
                  (lambda it: it.num_decode_tokens, "decode tokens"),
                  (lambda it: it.token_budget, "token budget")], "tokens per iteration")
    return Plot("token_budget", "Token budget per iteration",
                "Prefill and decode tokens computed in each iteration under the token budget.",
                fig)


def kv_usage(results: Sequence[Labeled]) -> Plot:
    def share(its: Sequence[Iteration], y: np.ndarray) -> np.ndarray:
        total = np.array([float(it.kv_blocks_total or 0) for it in its])
        return np.divide(y, total, out=np.zeros_like(y), where=total > 0)

    fig = _iteration_series(results, [(lambda it: it.kv_blocks_used, "KV use")],
                            "share of the KV pool", scale=share)
    return Plot("kv_usage", "KV cache use", "KV blocks in use as a share of the pool.", fig)


def batch_occupancy(results: Sequence[Labeled]) -> Plot:
    fig = _iteration_series(results, [(lambda it: it.num_running, "running"),
                                      (lambda it: it.num_waiting, "waiting")], "requests")
    return Plot("batch_occupancy", "Batch occupancy",
                "Running and waiting requests in each iteration.", fig)


def bandwidth(results: Sequence[Labeled]) -> Plot:
    """The static page's bandwidth plot: analytic per iteration, and the measured bandwidth
    where the result has GPU telemetry (GB/s against the GPU's peak; % of peak without it)."""
    data = []
    pct_only = False
    for i, x in enumerate(results):
        run = as_run(x.result)
        its = run.iterations or []
        line = {"color": _color(i)}
        if its:
            xs, ys = _thin(np.array([it.start_s for it in its], dtype=np.float64),
                           np.array([float(it.achieved_bw_gbps or 0.0) for it in its]))
            data.append({"type": "scatter", "mode": "lines", "x": xs, "y": ys, "line": line,
                         "name": f"{x.label}: analytic ({plots.memory_name(run)})"})
        peak = plots.peak_bw_gbps(run)
        for gpu, t, pct in plots.telemetry_bandwidth_by_gpu(run):  # one line per GPU
            xs, ys = _thin(t, pct * peak / 100 if peak else pct)
            name = f"{x.label}: {plots.measured_label(run)}" + (f" {gpu}" if gpu else "")
            trace = {"type": "scatter", "mode": "lines", "x": xs, "y": ys,
                     "line": {**line, "dash": "dot"}, "name": name,
                     **({} if peak else {"yaxis": "y2"})}
            pct_only = pct_only or not peak
            data.append(trace)
    layout: dict = {"height": 420, "xaxis": {"title": {"text": "time (s)"}},
                    "yaxis": {"title": {"text": "GB/s"}, "rangemode": "tozero"},
                    "legend": {"orientation": "h"}}
    if pct_only:
        layout.update(yaxis2={"title": {"text": "measured (% of peak)"}, "overlaying": "y",
                              "side": "right", "range": [0, 100]})
    title = plots.bandwidth_title(results)
    return Plot("bandwidth", title,
                "Analytic bandwidth per iteration (the cost model's bytes moved over the "
                "iteration's time) and, dotted, what GPU telemetry measured where recorded.",
                {"data": data, "layout": layout})


def request_timeline(pair: Sequence[Labeled], max_requests: int) -> Plot:
    ids = plots.gantt_rows(pair[0].result, max_requests)
    row_of = {rid: n for n, rid in enumerate(ids)}
    data = []
    layout = {"grid": {"rows": len(pair), "columns": 1, "pattern": "independent"},
              "height": 300 + 6 * len(ids) * len(pair), "barmode": "overlay",
              "legend": {"orientation": "h"}}
    spans = (("queued", "#bbbbbb"), ("prefill", "#ff7f0e"), ("decode", "#1f77b4"))
    for p, x in enumerate(pair, 1):
        axis = "" if p == 1 else str(p)
        run = as_run(x.result)
        sched = run.config.scheduler or ""
        layout[f"yaxis{axis}"] = {"title": {"text": f"{x.label} {sched}".strip()},
                                  "autorange": "reversed", "showticklabels": False}
        layout[f"xaxis{axis}"] = {"title": {"text": "time (s)"}}
        # Drawn: the requests that reached a first token (every one has an intended start:
        # report/check.py).
        reqs = [(r, r.ttft_ms, r.intended_start_s) for r in run.requests or []
                if r.id in row_of and r.ttft_ms is not None and r.intended_start_s is not None]
        bounds = []
        for r, ttft, start in reqs:
            service = start + (r.queue_ms or 0.0) / MS
            first = start + ttft / MS
            last = start + (r.e2el_ms or ttft) / MS
            bounds.append((start, service, first, last))
        b = np.array(bounds, dtype=np.float64).reshape(-1, 4)
        rows = [row_of[r.id] for r, _, _ in reqs]
        hover = [f"request {r.id}: {r.prompt_tokens} prompt, {r.output_tokens} output "
                 f"tokens; TTFT {ttft:.1f} ms, E2EL {(r.e2el_ms or 0):.1f} ms"
                 for r, ttft, _ in reqs]
        for k, (name, color) in enumerate(spans):
            data.append({
                "type": "bar", "orientation": "h", "y": rows, "x": (b[:, k + 1] - b[:, k]).tolist(),
                "base": b[:, k].tolist(), "name": name, "legendgroup": name,
                "showlegend": p == 1, "marker": {"color": color}, "text": hover,
                "hovertemplate": "%{text}<extra>" + name + "</extra>",
                "xaxis": f"x{axis}", "yaxis": f"y{axis}",
            })
    return Plot("request_timeline", "Request timeline: static vs continuous",
                "Each request's time queued, from admission to its first token, and decoding, "
                "from its intended start; hover for the request's figures.",
                {"data": data, "layout": layout})


# What a left-out plot lacked, said by what it reads: a --summary-only result was told "an
# endpoint run has no engine iterations" of its over-time plot, which reads requests.
READS_REQUESTS = ("latency_cdfs", "over_time", "request_timeline")
REQUEST_RECORDS_NOTE = "per-request records (a --summary-only result keeps none)."
ITERATION_RECORDS_NOTE = ("per-iteration records (an endpoint run has no engine iterations; a "
                          "--summary-only result keeps none).")


def _lower_first(title: str) -> str:
    """The title inside a sentence: "Batch occupancy" as "batch occupancy", "KV cache use" and
    "HBM bandwidth" as written (lower() gave "hbm bandwidth")."""
    return title if title[:2].isupper() else title[:1].lower() + title[1:]


def build_plots(results: Sequence[Labeled], max_gantt_requests: int,
                pair: Sequence[Labeled] | None) -> tuple[list[Plot], list[str]]:
    """The plots that have data, and a note for each left out."""
    candidates = [latency_cdfs(results), over_time(results), token_budget(results),
                  batch_occupancy(results), kv_usage(results), bandwidth(results)]
    # Only where a run made them (--slice; a server that told its timings): no note otherwise.
    candidates += [p for p in (time_slices(results), ttft_breakdown(results)) if p.points]
    if pair is not None:
        candidates.append(request_timeline(pair, max_gantt_requests))
    kept = [p for p in candidates if p.points > 0]
    # The static page's notes of what a kept plot could not show (cli/report.py), told of
    # the ITL lines this page draws from the summary's histogram too.
    from cbbench.report.notes import section_notes

    for p in kept:
        p.notes = section_notes(p.key, results, itl_drawn=lambda r: _itl_cdf(r) is not None)
    notes = [f"No {_lower_first(p.title)} plot: no result has "
             + (REQUEST_RECORDS_NOTE if p.key in READS_REQUESTS else ITERATION_RECORDS_NOTE)
             for p in candidates if p.points == 0]
    return kept, notes


def _json_script(obj) -> str:
    # Every "<" as \u003c (a "<" is only ever inside a JSON string): "</script" would end the
    # element early, and "<!--" then "<script" (a label's) keeps a browser from ending it at all.
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


LOADER = """
(function () {
  var counts = {};
  document.querySelectorAll('script[type="application/json"][data-plot]').forEach(function (el) {
    var fig = JSON.parse(el.textContent);
    Plotly.newPlot(el.dataset.plot, fig.data, fig.layout, {responsive: true, displaylogo: false});
    counts[el.dataset.plot] = fig.data.reduce(function (n, t) { return n + (t.x || []).length; }, 0);
  });
  document.getElementById("CHECK_ID").textContent = JSON.stringify(counts);
})();
""".replace("CHECK_ID", CHECK_ID)


def render_interactive(title: str, results: Sequence[Labeled], paths: Sequence[str],
                       page_plots: Sequence[Plot], notes: Sequence[str], plotly_js: str,
                       rows: Sequence[Row] = ROWS) -> str:
    esc = html.escape
    toc = "".join(f'<li><a href="#{p.key}">{esc(p.title)}</a></li>' for p in page_plots)
    sections = []
    for p in page_plots:
        sections.append(
            f'<section id="{p.key}"><h2>{esc(p.title)}</h2>'
            f'<p class="caption">{esc(p.caption)}</p>'
            + "".join(f'<p class="note">{esc(n)}</p>' for n in p.notes)
            + f'<div id="plot-{p.key}"></div>'
            f'<script type="application/json" data-plot="plot-{p.key}">'
            f"{_json_script(p.figure)}</script></section>"
        )
    ratio_hint = f"Ratios are against the first run, {results[0].label}." if len(results) > 1 else ""
    body = [
        f"<h1>{esc(title)}</h1>",
        *(f'<p class="note">{esc(n)}</p>' for n in notes),
        "<h2>Runs</h2>", runs_table(results, paths),
        "<h2>Summary</h2>", f'<p class="caption">{esc(ratio_hint)}</p>',
        f'<div id="summary-table">{summary_table(results, rows)}</div>',
    ]
    if len(results) > 1:
        body += ["<h2>Config differences</h2>", differences_table(results)]
    body += [f"<h2>Plots</h2><ul>{toc}</ul>", *sections,
             f'<pre id="{CHECK_ID}" hidden></pre>']
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n"
        f"<script>{plotly_js}</script>\n</head>\n<body>\n" + "\n".join(body)
        + f"\n<script>{LOADER}</script>\n</body>\n</html>\n"
    )


def plotly_js() -> str:
    """plotly.js from the plotly package, to embed: the page needs no network to open."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()
