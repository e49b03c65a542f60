"""NVML's GPM counters for one GPU: DRAM bandwidth and SM utilization over a window.

GPM (Hopper and newer) reports a metric as the difference of two samples, which NVML documents
must be more than 100 ms apart; the sampler may tick faster, so a ring of recent samples lets
every reading compare the newest sample with the newest earlier one that is old enough.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any

NVML_SUCCESS = 0


class GpmRing:
    """Recent GPM samples of one GPU, reused round-robin, so every GPM reading compares the
    newest sample with the newest earlier one that is at least `min_window_s` old. When the
    sampler ticks at or above that window this is simply the previous tick's sample."""

    def __init__(self, nvml: Any, handle: Any, min_window_s: float) -> None:
        self._nvml = nvml
        self._handle = handle
        self._min_window_s = min_window_s
        self._held: deque[tuple[float, Any]] = deque()  # (perf_counter time, sample), oldest first
        self._free: list[Any] = []
        self._allocated: list[Any] = []
        # Reused across calls: the struct has room for every metric id (~19 KB).
        self._query = nvml.c_nvmlGpmMetricsGet_t()

    def take(self) -> tuple[float | None, float | None]:
        """Take a GPM sample; return (DRAM bandwidth util %, SM util %) over the window it
        closes, or Nones while no earlier sample is old enough."""
        if self._free:
            buf = self._free.pop()
        else:
            buf = self._nvml.nvmlGpmSampleAlloc()
            self._allocated.append(buf)
        try:
            self._nvml.nvmlGpmSampleGet(self._handle, buf)
        except BaseException:
            self._free.append(buf)
            raise
        # Real time, not the run's clock: the minimum window is a hardware limit.
        now = time.perf_counter()
        # Older samples than the newest one old enough will never be chosen again.
        while len(self._held) >= 2 and now - self._held[1][0] >= self._min_window_s:
            self._free.append(self._held.popleft()[1])
        ref = None
        if self._held and now - self._held[0][0] >= self._min_window_s:
            ref = self._held[0][1]
        self._held.append((now, buf))
        return self._metrics(ref, buf) if ref is not None else (None, None)

    def _metrics(self, older: Any, newer: Any) -> tuple[float | None, float | None]:
        nvml, q = self._nvml, self._query
        q.version = nvml.NVML_GPM_METRICS_GET_VERSION
        q.numMetrics = 2
        q.sample1 = older
        q.sample2 = newer
        q.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        q.metrics[1].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        nvml.nvmlGpmMetricsGet(q)
        dram, sm = q.metrics[0], q.metrics[1]
        # A metric's value is valid only when its own return code is success.
        return (
            float(dram.value) if dram.nvmlReturn == NVML_SUCCESS else None,
            float(sm.value) if sm.nvmlReturn == NVML_SUCCESS else None,
        )

    def close(self) -> None:
        for buf in self._allocated:
            # Freeing after the GPU is lost may fail; there is nothing more to do about it.
            with contextlib.suppress(Exception):
                self._nvml.nvmlGpmSampleFree(buf)
        self._allocated.clear()
        self._free.clear()
        self._held.clear()
