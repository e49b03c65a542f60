"""Server metrics during a run: GET <endpoint>/metrics (Prometheus text format) every
SCRAPE_INTERVAL_S and keep a time series of the gauges and counters of the servers people run
(vLLM `vllm:`, SGLang `sglang:`, TGI `tgi_`, llama.cpp `llamacpp:`, cbbench `cbbench_`), or of
any metric whose name matches --scrape-metrics-filter (t_s on the run clock, name, labels,
value). The latency histograms of SERVER_HISTOGRAMS are kept as they stood before the run and at
its end, for the server's own TTFT/TPOT (analysis/server_latency.py). A failed scrape is
recorded, never fatal; `warning()` makes one console line of a scrape that failed or kept
nothing.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

from cbbench.analysis.server_latency import SERVER_HISTOGRAMS
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
# The lines of the latency histograms: samples (_bucket, _sum, _count) and their TYPE line.
_HIST_LINES = tuple(f"{n}_" for n in SERVER_HISTOGRAMS) + tuple(
    f"# TYPE {n} " for n in SERVER_HISTOGRAMS
)


def _metric_name(line: str) -> str:
    """The metric name of a sample line or a '# TYPE' line."""
    if line.startswith("# TYPE "):
        return line[7:].split(" ", 1)[0]
    end = len(line)
    for sep in ("{", " "):
        i = line.find(sep)
        if i != -1:
            end = min(end, i)
    return line[:end]


class MetricsScraper:
    """GETs <endpoint>/metrics every SCRAPE_INTERVAL_S on its own connection. Only the lines
    of the wanted metrics are kept during the run (a cheap filter; vLLM's page is mostly
    histogram buckets); parsing waits until the run is over, so it never stalls the event
    loop that timestamps tokens."""

    def __init__(self, base: str, headers: dict[str, str], name_filter: str | None = None):
        self.base = base
        self.headers = headers
        self.name_filter = re.compile(name_filter) if name_filter else None
        self.pages: list[tuple[float, str]] = []
        self.histograms: list[str] = []  # the latency histograms: [first scrape, latest]
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

    async def _scrape(self, t0: float, keep_page: bool = True) -> bool:
        self.attempts += 1
        t = time.perf_counter() - t0
        try:
            status, body = await get_body(
                self._session, self.base + "/metrics", SCRAPE_MAX_BYTES, SCRAPE_TIMEOUT_S
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
        lines = body.decode("utf-8", errors="replace").splitlines()
        hist = "\n".join(ln for ln in lines if ln.startswith(_HIST_LINES))
        self.histograms = [self.histograms[0], hist] if self.histograms else [hist]
        if keep_page:
            self.pages.append((t, "\n".join(ln for ln in lines if self._keep(ln))))
        return True

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
            await self._scrape(t0)  # the final values of the counters
        finally:
            await self._session.close()

    def histogram_texts(self) -> tuple[str, str] | None:
        """(before the run, at its end): the latency histograms' lines, when both were read."""
        if self.baseline_ok and len(self.histograms) == 2:
            return self.histograms[0], self.histograms[1]
        return None

    def result(self) -> dict:
        from prometheus_client.parser import text_string_to_metric_families

        rows: list[dict] = []
        parse_errors = 0
        for t, text in self.pages:
            try:
                for fam in text_string_to_metric_families(text):
                    if fam.type not in SCRAPE_TYPES:
                        continue
                    for s in fam.samples:
                        if s.name.endswith("_created"):  # a counter's creation timestamp
                            continue
                        rows.append(
                            {
                                "t_s": round(t, 4),
                                "name": s.name,
                                "labels": dict(s.labels),
                                "value": s.value,
                            }
                        )
            except ValueError as e:
                parse_errors += 1
                self.errors.append(f"t={t:.1f}s: unparsable metrics page: {e}")
        out = {
            "server_metrics": rows,
            "server_metrics_scrapes": {
                "attempts": self.attempts,
                "ok": len(self.pages) - parse_errors,
                "failed": len(self.errors),
                "gave_up": self.gave_up,
                "errors": self.errors[:MAX_ERRORS_KEPT],
                "kept": (
                    f"names matching {self.name_filter.pattern!r}" if self.name_filter
                    else "names starting " + ", ".join(SCRAPE_PREFIXES)
                ),
            },
        }
        texts = self.histogram_texts()
        if texts is not None:  # raw, for the result file; compared in finish_http_run
            out["server_histograms"] = {"before": texts[0], "after": texts[1]}
        return out


def warning(scrapes: dict, rows: list[dict]) -> str | None:
    """One console line when the scrape failed or kept nothing; None when it kept something."""
    if rows:
        return None
    if not scrapes["ok"]:
        last = scrapes["errors"][-1].split(": ", 1)[-1] if scrapes["errors"] else "no answer"
        return (
            f"--scrape-metrics: GET /metrics failed {scrapes['failed']} times (last: {last})"
            f"{', gave up' if scrapes['gave_up'] else ''}; no server metrics recorded"
        )
    return (
        f"--scrape-metrics: scraped /metrics {scrapes['ok']} times but no metric matched "
        f"(kept: {scrapes['kept']}); give --scrape-metrics-filter REGEX for this server's names"
    )
