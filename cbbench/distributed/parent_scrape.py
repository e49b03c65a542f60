"""--scrape-metrics of a multi-worker run: the parent samples the server's /metrics, from just
before the shared start instant until every worker is done, on its own thread and event loop
(the parent otherwise only waits on its workers' pipes, so no worker's timing shares it).

It ran on worker 0, inside that worker's own run: it stopped when worker 0's requests were
done, not the run's. 10 requests, the last of 1,000 output tokens on worker 1: the last scrape
at 0.50 s of a 4.69 s run, and the server's E2EL histogram read 9 of 10 requests, mean 86.6 ms
where the truth was 501.1 ms. The same for Ray actors (the driver scrapes)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

from cbbench.targets.options import EndpointOptions
from cbbench.targets.scrape import MetricsScraper


class ParentScrape:
    """One run's scraper in the parent: baseline() before t0, start(t0), finish() once every
    worker is final (its info keys, as run_http's scraper gives them), close() always."""

    def __init__(self, opts: EndpointOptions) -> None:
        # /metrics of the first URL, with the run's headers: what run_http scrapes.
        self._scraper = MetricsScraper(opts.endpoints()[0], opts.headers,
                                       opts.scrape_metrics_filter)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cbbench-scrape",
                                        daemon=True)
        self._thread.start()
        self._run: concurrent.futures.Future | None = None

    def baseline(self) -> None:
        """The histograms before the run (blocking: the workers wait for t0 meanwhile)."""
        asyncio.run_coroutine_threadsafe(self._scraper.baseline(), self._loop).result()

    def start(self, t0: float) -> None:
        """Scrape every SCRAPE_INTERVAL_S from `t0` (time.perf_counter(), the run clock)."""
        self._run = asyncio.run_coroutine_threadsafe(self._from(t0), self._loop)

    async def _from(self, t0: float) -> None:
        # t0 lies up to START_MARGIN_S ahead: the first page is the run's, at t_s >= 0.
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        await self._scraper.run(t0)

    def finish(self) -> dict:
        """Stop after one final scrape (the counters' end values); the result's info keys.
        Empty when the run never started (stopped while the workers set up)."""
        if self._run is None:
            return {}
        self._loop.call_soon_threadsafe(self._scraper.stop)
        self._run.result()
        return self._scraper.result()

    def close(self) -> None:
        if self._run is not None and not self._run.done():  # the run ended by an exception
            self._loop.call_soon_threadsafe(self._scraper.stop)
            try:
                self._run.result()
            except Exception:  # noqa: BLE001 - the run's own error is the one to report
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
