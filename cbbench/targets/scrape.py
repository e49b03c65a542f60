"""Server metrics during a run: GET <endpoint>/metrics (Prometheus text format) every
SCRAPE_INTERVAL_S and keep a time series of the gauges and counters of the servers people run
(vLLM `vllm:`, SGLang `sglang:`, TGI `tgi_`, llama.cpp `llamacpp:`, cbbench `cbbench_`), or of
any metric whose name matches --scrape-metrics-filter (t_s on the run clock, name, labels,
value). The latency histograms of SERVER_HISTOGRAMS are kept as they stood before the run and at
its end, for the server's own TTFT/TPOT (analysis/server_side/server_latency.py), and every
scrape's histogram counts are compared with the scrape before: a count that fell (a `_created`
that changed) is a restart of that label set, and the last scrape before it is kept, so the
run's increase is summed over the pieces between restarts (analysis/server_side/
histogram_window.py). A failed scrape is recorded, never fatal; `warning()` makes one console
line of scrapes that failed (the run's figures then have gaps, or stop early when the scrape
after the run failed: `complete` false, and the server's latency is left out, not read from an
earlier scrape) or kept nothing.

What a server sends never costs the run (issue 25): each page is filtered first (cheap name
tests), then at most MAX_SERIES_PER_SCRAPE series of it are parsed, line by line, in a thread
(asyncio.to_thread: a 16 MB page stalled the client's loop ~3 s a scrape); a malformed series
is dropped and counted (analysis/server_side/prom_text.py), never the page. The time series is bounded:
past MAX_SCRAPES_KEPT kept scrapes every other one is dropped and from then on only every
other scrape is kept (the resolution halves, the memory stays), and the latency histograms'
lines are capped at MAX_HISTOGRAM_LINES. A 4-request run took 54 s and a 5 s run wrote 173 MB
of a 300k-series page before.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

from cbbench.analysis.server_side.histogram_window import SeriesKey, series_key
from cbbench.analysis.server_side.prom_text import Dropped, family_of, metric_name, parse_sample
from cbbench.analysis.server_side.server_latency import SERVER_HISTOGRAMS
from cbbench.targets.transport import classify, get_body, new_session

if TYPE_CHECKING:
    import aiohttp

SCRAPE_INTERVAL_S = 0.5
SCRAPE_TIMEOUT_S = 2.0
SCRAPE_MAX_BYTES = 16 << 20
MAX_SCRAPE_FAILURES = 5  # in a row; then scraping stops for the rest of the run
SCRAPE_PREFIXES = ("vllm:", "sglang:", "tgi_", "llamacpp:", "cbbench_")
SCRAPE_TYPES = ("gauge", "counter")
MAX_ERRORS_KEPT = 10
# Bounds on what a scrape keeps (a vLLM page has ~100 gauge and counter series per model).
MAX_SERIES_PER_SCRAPE = 1000
MAX_SCRAPES_KEPT = 240  # 2 minutes at SCRAPE_INTERVAL_S; then thinned (see the module doc)
MAX_HISTOGRAM_LINES = 20_000
# Restarts of the server followed (each keeps one scrape's histogram lines); past this many the
# server's latency is left out.
MAX_RESTARTS_KEPT = 8
# The histogram samples compared scrape to scrape for a restart: a count falls, a birth time
# (prometheus_client's _created, where a server exposes it) changes.
_MARK_SUFFIXES = ("_count", "_created")
# The lines of the latency histograms: samples (_bucket, _sum, _count) and their TYPE line.
_HIST_LINES = tuple(f"{n}_" for n in SERVER_HISTOGRAMS) + tuple(
    f"# TYPE {n} " for n in SERVER_HISTOGRAMS
)


_metric_name = metric_name
_HIST_RE = re.compile("^(?:" + "|".join(re.escape(p) for p in _HIST_LINES) + ")[^\r\n]*",
                      re.MULTILINE)
SCAN_CHARS = 1 << 16


def _pieces(text: str):
    """``text`` in pieces of about SCAN_CHARS, each ending at a line's end."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + SCAN_CHARS)
        end = len(text) if end == -1 else end + 1
        yield text[start:end]
        start = end


_TYPE_RE = re.compile(r"^# TYPE [^\r\n]*", re.MULTILINE)
_KNOWN_RE = re.compile("^(?:" + "|".join(re.escape(p) for p in SCRAPE_PREFIXES) + ")[^\r\n]*",
                       re.MULTILINE)


class MetricsScraper:
    """GETs <endpoint>/metrics every SCRAPE_INTERVAL_S on its own connection. Only the lines
    of the wanted metrics are kept during the run (a cheap filter; vLLM's page is mostly
    histogram buckets); parsing waits until the run is over, so it never stalls the event
    loop that timestamps tokens."""

    def __init__(self, base: str, headers: dict[str, str], name_filter: str | None = None):
        self.base = base
        self.headers = headers
        self.name_filter = re.compile(name_filter) if name_filter else None
        self.pages: list[tuple[float, list[dict]]] = []  # (t, rows), parsed in a thread
        self.stride = 1  # keep every stride-th scrape (doubles each time the series thins)
        self.scrapes = 0  # successful scrapes of the run (baseline excluded)
        self.dropped = Dropped()  # malformed series, over the run
        self.series_cut = 0  # series beyond MAX_SERIES_PER_SCRAPE, summed over scrapes
        self.histogram_lines_cut = 0
        self.histograms: list[str] = []  # the latency histograms: [first scrape, latest]
        self._marks: dict[tuple[str, SeriesKey], float] = {}  # the latest scrape's counts
        self.restarts: list[dict] = []  # {"t_s", "before": histogram lines, "series"}
        self.restarts_beyond_cap = 0
        self.last_ok_t: float | None = None  # the run clock of the latest good scrape
        self.final_ok = False  # the scrape after the run was read
        self.baseline_ok = False  # the first scrape was taken before the run started
        self.errors: list[str] = []
        self.attempts = 0
        self.gave_up = False
        self._stop = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    def stop(self) -> None:
        self._stop.set()

    def wanted(self, name: str) -> bool:
        if self.name_filter is not None:
            return self.name_filter.search(name) is not None
        return name.startswith(SCRAPE_PREFIXES)

    def _keep(self, line: str) -> bool:
        if not line or line[0] == "#":
            if not line.startswith("# TYPE "):
                return False
            name = _metric_name(line)  # a family: its counter samples are named NAME_total
            return self.wanted(name) or self.wanted(name + "_total")
        return "_bucket{" not in line and self.wanted(_metric_name(line))

    async def _scrape(self, t0: float, keep_page: bool = True, final: bool = False) -> bool:
        self.attempts += 1
        t = time.perf_counter() - t0
        session = self._session
        assert session is not None  # baseline() or run() opened it
        try:
            status, body = await get_body(
                session, self.base + "/metrics", SCRAPE_MAX_BYTES, SCRAPE_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            self.errors.append(f"t={t:.1f}s: no answer within {SCRAPE_TIMEOUT_S:g} s")
            return False
        except Exception as e:
            self.errors.append(f"t={t:.1f}s: {classify(e)[1]}")
            return False
        if status != 200:
            self.errors.append(f"t={t:.1f}s: HTTP {status}")
            return False
        keep = keep_page and (final or self.scrapes % self.stride == 0)
        if keep_page:
            self.scrapes += 1
        # Off the event loop that timestamps tokens: decoding, filtering and parsing a large
        # page took seconds.
        hist, rows, marks = await asyncio.to_thread(self._digest, body, t, keep)
        self._note_restart(t, marks)
        self.histograms = [self.histograms[0], hist] if self.histograms else [hist]
        self.last_ok_t = t
        if keep:
            self.pages.append((t, rows))
            if len(self.pages) > MAX_SCRAPES_KEPT:  # a bounded time series: thin it
                self.pages = self.pages[::2]
                self.stride *= 2
        return True

    def _note_restart(self, t: float, marks: dict[tuple[str, SeriesKey], float]) -> None:
        """Keep the last scrape before the label sets whose count fell (or _created changed)
        since it: histogram_window.py sums the run's increase over the pieces between."""
        restarted = {
            key for (suffix, key), v in marks.items()
            if (old := self._marks.get((suffix, key))) is not None
            and (v < old if suffix == "_count" else v != old)
        }
        if restarted and self.histograms:
            if len(self.restarts) < MAX_RESTARTS_KEPT:
                self.restarts.append({
                    "t_s": round(t, 4), "before": self.histograms[-1],
                    "series": [[fam, dict(labels)] for fam, labels in sorted(restarted)],
                })
            else:
                self.restarts_beyond_cap += 1
        self._marks = marks

    @staticmethod
    def _marks_of(hist_lines: list[str]) -> dict[tuple[str, SeriesKey], float]:
        """{(suffix, label set): value} of the histograms' _count and _created samples: one
        or two lines a label set, parsed every scrape (the buckets are not)."""
        out: dict[tuple[str, SeriesKey], float] = {}
        unread = Dropped()  # a bad line is counted when the histograms are read, not here
        for ln in hist_lines:
            name = _metric_name(ln)
            suffix = next((x for x in _MARK_SUFFIXES if name.endswith(x)), None)
            if suffix is None or ln[0] == "#":
                continue
            sample = parse_sample(ln, unread)
            if sample is not None:
                key = (suffix, series_key(name[: -len(suffix)], sample.labels))
                out[key] = out.get(key, 0.0) + sample.value
        return out

    def _digest(
        self, body: bytes, t: float, keep: bool,
    ) -> tuple[str, list[dict], dict[tuple[str, SeriesKey], float]]:
        """(the latency histograms' lines, the kept gauges' and counters' rows, the
        histograms' counts) of a page: filtered by name first, then at most
        MAX_SERIES_PER_SCRAPE series parsed."""
        text = body.decode("utf-8", errors="replace")
        # Lines found by C-level regex scans, not a Python test per line (a 300k-series page
        # took seconds of the client's CPU a scrape that way), in pieces of SCAN_CHARS: one
        # C call holds the GIL, and a scan of the whole page stalled the event loop for it.
        pieces = list(_pieces(text))
        hist_lines = [ln for piece in pieces for ln in _HIST_RE.findall(piece)]
        if len(hist_lines) > MAX_HISTOGRAM_LINES:
            self.histogram_lines_cut += len(hist_lines) - MAX_HISTOGRAM_LINES
            hist_lines = hist_lines[:MAX_HISTOGRAM_LINES]
        marks = self._marks_of(hist_lines)
        if not keep:
            return "\n".join(hist_lines), [], marks
        types: dict[str, str] = {}
        for ln in (x for piece in pieces for x in _TYPE_RE.findall(piece)):
            parts = ln.split()
            if len(parts) >= 4 and self._keep(ln):
                types[parts[2]] = parts[3]
        if self.name_filter is None:
            wanted = [x for piece in pieces for x in _KNOWN_RE.findall(piece)
                      if "_bucket{" not in x]
        else:
            wanted = [x for x in text.splitlines() if x and x[0] != "#" and self._keep(x)]
        samples = wanted[:MAX_SERIES_PER_SCRAPE]
        self.series_cut += len(wanted) - len(samples)
        rows = []
        for ln in samples:
            sample = parse_sample(ln, self.dropped)
            if sample is None or sample.name.endswith("_created"):  # a counter's birth time
                continue
            fam = family_of(sample.name, types)
            if fam is None or types[fam] not in SCRAPE_TYPES:
                continue
            rows.append({"t_s": round(t, 4), "name": sample.name, "labels": sample.labels,
                         "value": sample.value})
        return "\n".join(hist_lines), rows, marks

    async def baseline(self) -> None:
        """One scrape before the run starts: the histograms' starting point."""
        self._session = new_session(self.headers, max_connections=1)  # its own connection
        self.baseline_ok = await self._scrape(time.perf_counter(), keep_page=False)

    async def run(self, t0: float) -> None:
        if self._session is None:
            self._session = new_session(self.headers, max_connections=1)
        failures = 0
        try:
            k = 0
            while not self._stop.is_set():
                failures = 0 if await self._scrape(t0) else failures + 1
                if failures >= MAX_SCRAPE_FAILURES:
                    self.gave_up = True
                    return
                k += 1
                delay = t0 + k * SCRAPE_INTERVAL_S - time.perf_counter()
                try:
                    await asyncio.wait_for(self._stop.wait(), max(0.0, delay))
                except asyncio.TimeoutError:
                    pass
            self.final_ok = await self._scrape(t0, final=True)  # the counters' final values
        finally:
            await self._session.close()

    def histogram_texts(self) -> tuple[str, str] | None:
        """(before the run, at its end): the latency histograms' lines, when both were read."""
        if self.baseline_ok and len(self.histograms) == 2:
            return self.histograms[0], self.histograms[1]
        return None

    def result(self) -> dict:
        rows = [row for _, page in self.pages for row in page]
        out = {
            "server_metrics": rows,
            "server_metrics_scrapes": {
                "attempts": self.attempts,
                "ok": self.scrapes,
                "failed": len(self.errors),
                "gave_up": self.gave_up,
                # The scrape after the run was read: without it the run's last figures are
                # those of the latest good scrape (last_ok_t_s on the run clock).
                "final_ok": self.final_ok,
                "last_ok_t_s": None if self.last_ok_t is None else round(self.last_ok_t, 4),
                "errors": self.errors[:MAX_ERRORS_KEPT],
                "kept": (
                    f"names matching {self.name_filter.pattern!r}" if self.name_filter
                    else "names starting " + ", ".join(SCRAPE_PREFIXES)
                ),
                # What the bounds left out (module doc): never silently.
                "kept_every": self.stride,
                "dropped_series": self.dropped.count,
                "dropped_first": self.dropped.first,
                "series_beyond_cap": self.series_cut,
                "histogram_lines_beyond_cap": self.histogram_lines_cut,
            },
        }
        texts = self.histogram_texts()
        if texts is not None:  # raw, for the result file; compared in finish_http_run
            out["server_histograms"] = {
                "before": texts[0], "after": texts[1],
                # "after" was read after the run ended: else it is an earlier window's.
                "complete": self.final_ok,
                "after_t_s": None if self.last_ok_t is None else round(self.last_ok_t, 4),
                "restarts": self.restarts,
                "restarts_beyond_cap": self.restarts_beyond_cap,
            }
        return out


def warning(scrapes: dict, rows: list[dict]) -> str | None:
    """One console line when a scrape failed or the scrapes kept nothing; None when every
    scrape was read and kept something. A failure among good scrapes is said too (it was
    silent): the time series has a gap, or, when the scrape after the run failed, the run's
    figures stop at the last good scrape."""
    last = scrapes["errors"][-1].split(": ", 1)[-1] if scrapes["errors"] else "no answer"
    if not scrapes["ok"]:
        return (
            f"--scrape-metrics: GET /metrics failed {scrapes['failed']} times (last: {last})"
            f"{', gave up' if scrapes['gave_up'] else ''}; no server metrics recorded"
        )
    fails = None
    if scrapes["failed"]:
        fails = (f"GET /metrics failed {scrapes['failed']} of {scrapes['attempts']} times (last: "
                 f"{last}){', gave up' if scrapes['gave_up'] else ''}")
        if scrapes.get("final_ok", True):  # results written before the key: read at the end
            fails += "; the server metrics' time series has gaps"
        else:
            t = scrapes.get("last_ok_t_s")
            at = f" at t={t:.1f} s" if isinstance(t, (int, float)) else ""
            fails += (f"; none was read after the run, so the server metrics stop at the last "
                      f"good one{at}")
    if not rows:
        return (
            f"--scrape-metrics: scraped /metrics {scrapes['ok']} times but no metric matched "
            f"(kept: {scrapes['kept']}); give --scrape-metrics-filter REGEX for this server's "
            "names" + (f"; {fails}" if fails else "")
        )
    return f"--scrape-metrics: {fails}" if fails else None
