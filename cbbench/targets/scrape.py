"""Server metrics during a run: GET <endpoint>/metrics (Prometheus text format) every
SCRAPE_INTERVAL_S and keep a time series of the gauges and counters named vllm:* or cbbench_*
(t_s on the run clock, name, labels, value). A failed scrape is recorded, never fatal.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from cbbench.targets.transport import classify, get_body, new_session

if TYPE_CHECKING:
    import aiohttp

SCRAPE_INTERVAL_S = 0.5
SCRAPE_TIMEOUT_S = 2.0
SCRAPE_MAX_BYTES = 16 << 20
MAX_SCRAPE_FAILURES = 5  # in a row; then scraping stops for the rest of the run
SCRAPE_PREFIXES = ("vllm:", "cbbench_")
SCRAPE_TYPES = ("gauge", "counter")
MAX_ERRORS_KEPT = 10


class MetricsScraper:
    """GETs <endpoint>/metrics every SCRAPE_INTERVAL_S on its own connection. Only the lines
    of the wanted metrics are kept during the run (a cheap filter; vLLM's page is mostly
    histogram buckets); parsing waits until the run is over, so it never stalls the event
    loop that timestamps tokens."""

    def __init__(self, base: str, headers: dict[str, str]):
        self.base = base
        self.headers = headers
        self.pages: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self.attempts = 0
        self.gave_up = False
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    @staticmethod
    def _keep(line: str) -> bool:
        if line.startswith("# TYPE "):
            return line[7:].startswith(SCRAPE_PREFIXES)
        return line.startswith(SCRAPE_PREFIXES) and "_bucket{" not in line

    async def _scrape(self, session: aiohttp.ClientSession, t0: float) -> bool:
        self.attempts += 1
        t = time.perf_counter() - t0
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
        text = body.decode("utf-8", errors="replace")
        self.pages.append((t, "\n".join(ln for ln in text.splitlines() if self._keep(ln))))
        return True

    async def run(self, t0: float) -> None:
        failures = 0
        session = new_session(self.headers, max_connections=1)  # its own connection
        try:
            k = 0
            while not self._stop.is_set():
                failures = 0 if await self._scrape(session, t0) else failures + 1
                if failures >= MAX_SCRAPE_FAILURES:
                    self.gave_up = True
                    return
                k += 1
                delay = t0 + k * SCRAPE_INTERVAL_S - time.perf_counter()
                try:
                    await asyncio.wait_for(self._stop.wait(), max(0.0, delay))
                except asyncio.TimeoutError:
                    pass
            await self._scrape(session, t0)  # the final values of the counters
        finally:
            await session.close()

    def result(self) -> dict:
        from prometheus_client.parser import text_string_to_metric_families

        rows: list[dict] = []
        parse_errors = 0
        for t, text in self.pages:
            try:
                for fam in text_string_to_metric_families(text):
                    if fam.type not in SCRAPE_TYPES or not fam.name.startswith(SCRAPE_PREFIXES):
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
        return {
            "server_metrics": rows,
            "server_metrics_scrapes": {
                "attempts": self.attempts,
                "ok": len(self.pages) - parse_errors,
                "failed": len(self.errors),
                "gave_up": self.gave_up,
                "errors": self.errors[:MAX_ERRORS_KEPT],
            },
        }
