"""GPU telemetry from a DCGM exporter: the Prometheus page NVIDIA's dcgm-exporter serves beside
a GPU server (usually port 9400), scraped while a run runs.

Against a remote endpoint (vLLM, SGLang, TGI on a GPU server) the in-process NVML sampler
(:mod:`cbbench.bench.nvml_sampler`) sees no GPU; the server's operators run dcgm-exporter, whose
profiling fields carry the same quantities. Each ``--gpu-metrics URL`` gets a background thread
that reads the page every telemetry interval, keeps one sample per GPU (labels ``gpu``,
``UUID``, ``Hostname``) stamped with the run's clock, and hands the samples to
:mod:`cbbench.analysis.summary.telemetry`, so the result's ``telemetry`` section, the steady-state
summary line and the report's plots are the NVML sampler's, with ``source: "dcgm"``.

Field mapping (DCGM's profiling fields are ratios 0-1; cbbench's fields are percentages):

- ``dram_bw_util_pct`` = DCGM_FI_PROF_DRAM_ACTIVE x 100 (the share of cycles the device memory
  interface was busy sending or receiving: the HBM bandwidth utilization, as NVML's GPM reads
  it); where the exporter has no profiling fields, DCGM_FI_DEV_MEM_COPY_UTIL (the memory
  controller's busy percentage, a different quantity: ``metric`` says which, one per result);
- ``sm_util_pct`` = DCGM_FI_PROF_SM_ACTIVE x 100, else DCGM_FI_DEV_GPU_UTIL;
- ``tensor_active_pct`` = DCGM_FI_PROF_PIPE_TENSOR_ACTIVE x 100 (DCGM only);
- ``memory_used_bytes`` = DCGM_FI_DEV_FB_USED (MiB) x 2^20; ``sm_clock_mhz``, ``mem_clock_mhz``
  = DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK; ``power_w`` = DCGM_FI_DEV_POWER_USAGE;
  ``total_energy_mj`` = DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (the run's energy is its difference).

A GPU is its ``Hostname``, ``UUID`` and ``gpu`` labels: pages from two hosts both have a
``gpu="0"``, and the per-GPU figures (telemetry.per_gpu) keep them apart.

The exporter itself refreshes its values every collection interval (its ``-c``, 30 s by
default): scraping faster than that repeats values, so the interval is recorded beside them.

A page that is down, slow, too big or malformed costs the telemetry, never the run: each
failed scrape is counted and the first error kept (the result's ``error`` then, or ``available:
false`` when no page was ever read, with a one-line warning); each read has a deadline and a
byte cap, and runs in its own daemon thread, so the load generator never waits on it.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cbbench.analysis.summary.telemetry import (
    METRIC_DCGM,
    METRIC_MC_BUSY,
    SOURCE_DCGM,
    TelemetrySample,
    section,
)

# A dcgm-exporter page for 8 GPUs with every default field is ~100 KB: 4 MiB is far past any
# real page, and bounds what a wrong URL (a file server, a log) can make us hold.
MAX_PAGE_BYTES = 4 << 20
# One read (connect, headers and body together) may take this long; the exporter answers in
# milliseconds, so a slower page is a sick one and the tick is skipped.
SCRAPE_TIMEOUT_S = 2.0
READ_CHUNK_BYTES = 64 << 10
# stop() waits this long for a thread in the middle of a read; a thread still reading is left
# to finish on its own (a daemon): its late sample is dropped, the run's end is not delayed.
STOP_JOIN_S = 0.5
PERCENT = 100.0
MIB = 1 << 20
NOT_STARTED_REASON = "DCGM scraper was not started"

DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
MEM_CLOCK = "DCGM_FI_DEV_MEM_CLOCK"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since the driver loaded
FIELDS = (DRAM_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE, MEM_COPY_UTIL, GPU_UTIL, FB_USED, SM_CLOCK,
          MEM_CLOCK, POWER_USAGE, TOTAL_ENERGY)


class ScrapeError(Exception):
    """One scrape that gave no samples: the page was down, slow, too big or malformed."""


@dataclass(frozen=True)
class DcgmSample(TelemetrySample):
    """One GPU on one DCGM page: the NVML sampler's fields, and where it came from."""

    hostname: str | None = None
    uuid: str | None = None
    tensor_active_pct: float | None = None


@dataclass(frozen=True)
class GpuReading:
    """One GPU's values on one page, keyed by its labels."""

    gpu: int
    hostname: str | None
    uuid: str | None
    values: dict[str, float]


def fetch_page(url: str, timeout_s: float | None = None, max_bytes: int | None = None) -> str:
    """The page's text, or ScrapeError: refused, an HTTP error, past ``timeout_s`` in all (a
    page that trickles in is cut off, not only one that stalls), or over ``max_bytes``
    (defaults: SCRAPE_TIMEOUT_S, MAX_PAGE_BYTES, read at the call)."""
    timeout_s = SCRAPE_TIMEOUT_S if timeout_s is None else timeout_s
    max_bytes = MAX_PAGE_BYTES if max_bytes is None else max_bytes
    deadline = time.monotonic() + timeout_s
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - user's URL
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise ScrapeError(f"no complete page within {timeout_s:g} s")
                chunk = resp.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise ScrapeError(f"page larger than {max_bytes} bytes")
                chunks.append(chunk)
    except ScrapeError:
        raise
    except urllib.error.HTTPError as e:
        raise ScrapeError(f"HTTP {e.code}") from None
    except urllib.error.URLError as e:
        raise ScrapeError(f"cannot connect ({e.reason})") from None
    except TimeoutError:
        raise ScrapeError(f"no answer within {timeout_s:g} s") from None
    except (OSError, ValueError) as e:  # a reset connection, a bad status line
        raise ScrapeError(f"{type(e).__name__}: {e}") from None
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError("page is not UTF-8 text") from None


def parse_page(text: str) -> list[GpuReading]:
    """Every GPU on a DCGM page, with the fields cbbench reads; ScrapeError when the page is
    not Prometheus text or holds none of them."""
    from prometheus_client.parser import text_string_to_metric_families

    by_gpu: dict[tuple[str | None, int, str | None], dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                # The exporter declares the energy a counter, and the parser names a counter's
                # sample with "_total" appended.
                name = s.name.removesuffix("_total") if family.type == "counter" else s.name
                if name not in FIELDS or "gpu" not in s.labels:
                    continue
                try:
                    gpu = int(s.labels["gpu"])
                except ValueError:
                    continue  # a label that is not a GPU number is not DCGM's
                key = (s.labels.get("Hostname"), gpu, s.labels.get("UUID"))
                by_gpu.setdefault(key, {})[name] = float(s.value)
    except Exception as e:  # noqa: BLE001 - the parser raises ValueError, IndexError, ...
        raise ScrapeError(f"not a Prometheus text page ({type(e).__name__}: {e})") from None
    if not by_gpu:
        raise ScrapeError("no DCGM GPU fields on the page (is it a dcgm-exporter?)")
    return [GpuReading(gpu, host, uuid, values)
            for (host, gpu, uuid), values in sorted(by_gpu.items(), key=lambda kv: kv[0][1])]


def _pct(values: dict[str, float], ratio: str, percent: str | None) -> float | None:
    if ratio in values:
        return values[ratio] * PERCENT
    return values.get(percent) if percent is not None else None


def _int(v: float | None, scale: float = 1.0) -> int | None:
    return None if v is None else int(round(v * scale))


def to_sample(r: GpuReading, t_s: float, profiling: bool) -> DcgmSample:
    """A reading as the NVML sampler's sample: ``profiling`` (the page has DCGM_FI_PROF_*)
    picks DRAM_ACTIVE, else the memory-copy utilization, one metric for the whole result."""
    v = r.values
    dram = _pct(v, DRAM_ACTIVE, None) if profiling else v.get(MEM_COPY_UTIL)
    return DcgmSample(
        t_s=t_s,
        gpu=r.gpu,
        dram_bw_util_pct=dram,
        sm_util_pct=_pct(v, SM_ACTIVE, GPU_UTIL),
        memory_used_bytes=_int(v.get(FB_USED), MIB),
        sm_clock_mhz=_int(v.get(SM_CLOCK)),
        mem_clock_mhz=_int(v.get(MEM_CLOCK)),
        power_w=v.get(POWER_USAGE),
        total_energy_mj=v.get(TOTAL_ENERGY),
        hostname=r.hostname,
        uuid=r.uuid,
        tensor_active_pct=_pct(v, TENSOR_ACTIVE, None),
    )


@dataclass
class _Page:
    """One URL's thread and what it saw."""

    url: str
    ok: int = 0
    failed: int = 0
    first_error: str | None = None
    thread: threading.Thread | None = None
    samples: list[DcgmSample] = field(default_factory=list)


class DcgmScraper:
    """Scrapes each URL in its own thread between start() and stop(); the NVML sampler's
    interface (start, stop, to_result), so the runner treats both alike.

    ``clock`` returns seconds since the run started and stamps each page at the middle of its
    read (the exporter's values are its latest at that moment). ``fetch`` is fetch_page, or a
    fake in tests."""

    def __init__(
        self,
        urls: Sequence[str],
        interval_s: float,
        clock: Callable[[], float] | None = None,
        fetch: Callable[[str], str] = fetch_page,
        shown_urls: Sequence[str] | None = None,
    ) -> None:
        if not urls:
            raise ValueError("no DCGM exporter URL given")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = float(interval_s)
        self._clock_arg = clock
        self._clock: Callable[[], float] = clock or time.perf_counter
        self._fetch = fetch
        self._pages = [_Page(u) for u in urls]
        self._shown = list(shown_urls) if shown_urls is not None else list(urls)
        self._metric: str | None = None  # decided by the first page read, for every page
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._started = False

    def start(self) -> None:
        if self._started:
            raise RuntimeError("DcgmScraper.start() called twice")
        self._started = True
        if self._clock_arg is None:
            t0 = time.perf_counter()
            self._clock = lambda: time.perf_counter() - t0
        for i, page in enumerate(self._pages):
            page.thread = threading.Thread(target=self._run, args=(page,), daemon=True,
                                           name=f"cbbench-dcgm-{i}")
            page.thread.start()

    def stop(self) -> None:
        self._stop_event.set()
        for page in self._pages:
            if page.thread is not None:
                page.thread.join(STOP_JOIN_S)

    def __enter__(self) -> DcgmScraper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the threads -------------------------------------------------------------------------

    def _run(self, page: _Page) -> None:
        while not self._stop_event.is_set():
            tick = time.perf_counter()
            self._scrape(page)
            self._stop_event.wait(max(0.0, tick + self.interval_s - time.perf_counter()))

    def _scrape(self, page: _Page) -> None:
        before = self._clock()
        try:
            readings = parse_page(self._fetch(page.url))
        except ScrapeError as e:
            self._failed(page, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a fake fetch, an unforeseen parser error
            self._failed(page, f"{type(e).__name__}: {e}")
            return
        t_s = (before + self._clock()) / 2
        with self._lock:
            if self._stop_event.is_set():
                return  # read after the run ended: off the run's clock
            if self._metric is None:
                profiling = any(DRAM_ACTIVE in r.values for r in readings)
                self._metric = METRIC_DCGM if profiling else METRIC_MC_BUSY
            page.samples += [to_sample(r, t_s, self._metric == METRIC_DCGM) for r in readings]
            page.ok += 1

    def _failed(self, page: _Page, error: str) -> None:
        with self._lock:
            if self._stop_event.is_set():
                return
            page.failed += 1
            if page.first_error is None:
                page.first_error = error

    # -- the result --------------------------------------------------------------------------

    def to_result(self, window: tuple[float, float] | None = None,
                  span: tuple[float, float] | None = None) -> dict[str, Any]:
        """The telemetry section (telemetry.section's, source "dcgm"), with each page's scrape
        counts under ``scrapes``."""
        with self._lock:
            samples = sorted((s for p in self._pages for s in p.samples),
                             key=lambda s: (s.t_s, s.hostname or "", s.gpu))
            pages = [(shown, p.ok, p.failed, p.first_error)
                     for shown, p in zip(self._shown, self._pages)]
        problems = [f"{shown}: {failed} of {ok + failed} scrapes failed (first: {err})"
                    for shown, ok, failed, err in pages if failed]
        if not self._started:
            available, reason, error = False, NOT_STARTED_REASON, None
        elif not samples:
            available, error = False, None
            reason = "no DCGM page could be read: " + (
                "; ".join(problems) or "the run ended before the first scrape")
        else:
            available, reason, error = True, None, "; ".join(problems) or None
        out = section(
            available=available, reason=reason, error=error, metric=self._metric,
            gpu_indices=sorted({s.gpu for s in samples}), interval_s=self.interval_s,
            samples=samples, window=window, index_kind="dcgm", source=SOURCE_DCGM, span=span,
        )
        out["scrapes"] = [{"url": shown, "ok": ok, "failed": failed, "first_error": err}
                          for shown, ok, failed, err in pages]
        return out
