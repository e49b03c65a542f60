"""GPU telemetry sampled through NVML while a benchmark runs.

A background thread reads every requested GPU each `interval_s` and stamps each reading with the
run's clock, so telemetry lines up with engine iterations and request events. The headline
quantity is DRAM bandwidth utilization from NVML's GPM counters (Hopper and newer); where GPM
is missing the sampler falls back to the memory controller's busy percentage, which is a
different quantity (the share of time memory was read or written at all, not the share of peak
bandwidth used), so the result names which one was measured in `metric`.

Nothing here raises because a GPU is missing: without NVML, without a GPU, or without
permission, `start()` returns normally and the result says `available: false` with the reason.
An NVML error mid-run stops sampling, keeps what was sampled, and is recorded in `error`.

NVML is reached through nvidia-ml-py (imported as `pynvml`), imported only when sampling
starts; tests inject a fake module object instead.

Which GPU: NVML numbers every GPU of the host, while a process's CUDA device 0 is whatever
CUDA_VISIBLE_DEVICES (and CUDA's device order) made it. With ``index_kind="cuda"`` the indices
are the process's CUDA ordinals, mapped to NVML handles by PCI bus id (torch reports each
device's), or, without torch's view, through CUDA_VISIBLE_DEVICES (an index, or a GPU/MIG
UUID); ``"nvml"`` indices are NVML's own (nvidia-smi's).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SOURCE = "nvml"
METRIC_GPM = "dram_bw_util_gpm"
METRIC_MC_BUSY = "memory_controller_busy"

DEFAULT_INTERVAL_S = 0.05
# NVML documents that two nvmlGpmSampleGet calls must be more than 100 ms apart (the counters
# refresh internally at that rate), so each GPM reading spans at least this long even when the
# sampler ticks faster; the other quantities are still read every tick.
GPM_MIN_WINDOW_S = 0.1
# With no steady-state window from the caller, drop this share of the sampled span at each end
# (ramp-up and drain): the middle 80% is kept.
DEFAULT_STEADY_TRIM_FRACTION = 0.1
PERCENTILES = (50, 90)
# A thread stuck inside an NVML call (e.g. a GPU falling off the bus) must not hang the run.
JOIN_TIMEOUT_S = 5.0
MILLIWATTS_PER_WATT = 1000.0
NVML_SUCCESS = 0
# pynvml's NVML_ERROR_NOT_SUPPORTED, used when the injected module does not define it.
NVML_ERROR_NOT_SUPPORTED_DEFAULT = 3

RULE_CALLER = "given by caller"
RULE_MIDDLE = "middle 80% of the sampled time span"
RULE_NO_SAMPLES = "no samples"
SIMULATED_GPU_REASON = "simulated GPU: nothing to sample"
NOT_STARTED_REASON = "telemetry sampler was not started"

INDEX_KINDS = ("nvml", "cuda")

QUANTITIES = (
    "dram_bw_util_pct",
    "sm_util_pct",
    "memory_used_bytes",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
)


@dataclass(frozen=True)
class TelemetrySample:
    """One reading of one GPU; None where the GPU does not report that quantity (or, for the
    GPM quantities, before a GPM window of GPM_MIN_WINDOW_S has elapsed)."""

    t_s: float
    gpu: int
    dram_bw_util_pct: float | None
    sm_util_pct: float | None
    memory_used_bytes: int | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    power_w: float | None


@dataclass(frozen=True)
class SteadyWindow:
    start_s: float
    end_s: float
    rule: str


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None}
    arr = np.asarray(values, dtype=float)
    p50, p90 = np.percentile(arr, PERCENTILES)  # numpy's default is linear interpolation
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90)}


def _quantity_stats(samples: Sequence[TelemetrySample]) -> dict[str, dict[str, float | None]]:
    # Pooled over GPUs: each sample is one GPU at one time.
    return {
        name: _stats([v for s in samples if (v := getattr(s, name)) is not None])
        for name in QUANTITIES
    }


def steady_window(
    samples: Sequence[TelemetrySample], window: tuple[float, float] | None = None
) -> SteadyWindow:
    """The caller's window, or else the middle 80% of the span the samples cover."""
    if window is not None:
        start_s, end_s = float(window[0]), float(window[1])
        if end_s < start_s:
            raise ValueError(f"steady window ends before it starts: {window}")
        return SteadyWindow(start_s, end_s, RULE_CALLER)
    if not samples:
        return SteadyWindow(0.0, 0.0, RULE_NO_SAMPLES)
    first = min(s.t_s for s in samples)
    last = max(s.t_s for s in samples)
    trim = (last - first) * DEFAULT_STEADY_TRIM_FRACTION
    return SteadyWindow(first + trim, last - trim, RULE_MIDDLE)


def summarize(
    samples: Sequence[TelemetrySample], window: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Mean, p50 and p90 of each quantity over the whole run and over the steady window."""
    win = steady_window(samples, window)
    steady = [s for s in samples if win.start_s <= s.t_s <= win.end_s]
    return {
        "window": asdict(win),
        "run": _quantity_stats(samples),
        "steady": _quantity_stats(steady),
    }


def _section(
    *,
    available: bool,
    reason: str | None,
    error: str | None,
    metric: str | None,
    gpu_indices: Sequence[int],
    interval_s: float,
    samples: Sequence[TelemetrySample],
    window: tuple[float, float] | None,
    index_kind: str | None = None,
) -> dict[str, Any]:
    return {
        "available": available,
        "reason": reason,
        "error": error,
        "source": SOURCE,
        "metric": metric,
        "gpu_indices": [int(i) for i in gpu_indices],
        "index_kind": index_kind,  # gpu_indices are NVML's ("nvml") or CUDA ordinals ("cuda")
        "interval_s": float(interval_s),
        "samples": [asdict(s) for s in samples],
        "summary": summarize(samples, window),
    }


def unavailable(reason: str) -> dict[str, Any]:
    """The telemetry section for a target with no GPU to sample (e.g. the simulated engine).
    Nothing was sampled, so gpu_indices is empty and interval_s is 0.0."""
    return _section(
        available=False,
        reason=reason,
        error=None,
        metric=None,
        gpu_indices=[],
        interval_s=0.0,
        samples=[],
        window=None,
    )


def warning_line(section: dict[str, Any]) -> str | None:
    """The one-line stderr warning for a telemetry section, or None when there is nothing to
    warn about. The caller decides whether to print it (a simulated target may not)."""
    if not section.get("available"):
        text = f"warning: GPU telemetry unavailable: {section.get('reason')}"
    elif section.get("error"):
        text = f"warning: GPU telemetry stopped early: {section.get('error')}"
    else:
        return None
    return " ".join(text.split())  # one line whatever the NVML message holds


def _describe(err: BaseException) -> str:
    return str(err) or type(err).__name__


class _GpmRing:
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


def torch_pci_bus_id(cuda_index: int) -> str | None:
    """The PCI bus id of this process's CUDA device ``cuda_index`` in NVML's form
    ("00000000:3B:00.0"), from torch (CUDA_VISIBLE_DEVICES and the device order applied), or
    None when torch is not loaded or has no such CUDA device. Never imports torch itself."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(cuda_index)
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except Exception:  # noqa: BLE001 - an old torch without the fields, a bad index
        return None


def visible_device(cuda_index: int, env: dict | None = None) -> int | str:
    """CUDA_VISIBLE_DEVICES' entry for ``cuda_index``: an NVML index (int) or a UUID (str);
    ``cuda_index`` itself when the variable is unset."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return cuda_index
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if cuda_index >= len(entries):
        raise ValueError(f"CUDA device {cuda_index} is not visible (CUDA_VISIBLE_DEVICES={value})")
    entry = entries[cuda_index]
    return int(entry) if entry.isdigit() else entry


@dataclass
class _Device:
    index: int
    handle: Any
    has_memory: bool = True
    has_sm_clock: bool = True
    has_mem_clock: bool = True
    has_power: bool = True
    has_utilization: bool = True
    gpm: _GpmRing | None = None


class TelemetrySampler:
    """Samples GPUs in a background thread between start() and stop().

    `clock` returns seconds since the run started (default: time.perf_counter relative to
    start()); it is called once per sample, only to stamp it. Pacing uses the real clock, so a
    virtual clock cannot make the thread spin. `nvml` is the pynvml module, or a fake in tests.
    """

    def __init__(
        self,
        gpu_indices: list[int],
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] | None = None,
        nvml: Any = None,
        index_kind: str = "nvml",
        pci_bus_id_of: Callable[[int], str | None] = torch_pci_bus_id,
    ) -> None:
        if index_kind not in INDEX_KINDS:
            raise ValueError(f"index_kind must be one of {INDEX_KINDS}, got {index_kind!r}")
        self.index_kind = index_kind
        self._pci_bus_id_of = pci_bus_id_of
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        if len(set(gpu_indices)) != len(gpu_indices):
            raise ValueError(f"duplicate GPU indices: {gpu_indices}")
        self.gpu_indices = [int(i) for i in gpu_indices]
        self.interval_s = float(interval_s)
        self._clock_arg = clock
        self._clock: Callable[[], float] = clock or time.perf_counter
        self._nvml = nvml
        self._gpm_min_window_s = GPM_MIN_WINDOW_S
        self._available = False
        self._reason: str | None = NOT_STARTED_REASON
        self._error: str | None = None
        self._metric: str | None = None
        # Why GPM was not used, when it was not (diagnostics; not part of the result).
        self.gpm_fallback_reason: str | None = None
        self._devices: list[_Device] = []
        self._samples: list[TelemetrySample] = []
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._initialized = False
        self._started = False
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Initialize NVML and start sampling; on any NVML problem, record it and return."""
        if self._started:
            raise RuntimeError("TelemetrySampler.start() called twice")
        self._started = True
        if self._clock_arg is None:
            t0 = time.perf_counter()
            self._clock = lambda: time.perf_counter() - t0
        reason = self._open()
        if reason is not None:
            self._available, self._reason = False, reason
            self._release()
            return
        self._available, self._reason = True, None
        self._thread = threading.Thread(target=self._run, name="cbbench-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and release NVML; safe to call more than once."""
        if not self._started or self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                # Stuck in NVML: keep what was sampled and leave NVML to the daemon thread.
                self._error = self._error or (
                    f"sampling thread did not stop within {JOIN_TIMEOUT_S:g} s"
                )
                return
        self._release()

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def to_result(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """The JSON-ready telemetry section; `window` is the steady-state (start_s, end_s)."""
        with self._lock:
            samples = list(self._samples)
        return _section(
            available=self._available,
            reason=self._reason,
            error=self._error,
            metric=self._metric,
            gpu_indices=self.gpu_indices,
            interval_s=self.interval_s,
            samples=samples,
            window=window,
            index_kind=self.index_kind,
        )

    # -- set-up and tear-down ----------------------------------------------------------------

    def _open(self) -> str | None:
        """Initialize NVML, find the GPUs and what they report; the reason on failure."""
        if not self.gpu_indices:
            return "no GPU indices given"
        if self._nvml is None:
            try:
                import pynvml  # from nvidia-ml-py
            except ImportError as err:
                return f"nvidia-ml-py is not installed ({err})"
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            return _describe(err)  # e.g. "NVML Shared Library Not Found"
        except Exception as err:  # e.g. a broken driver install; never fail the run over it
            return f"NVML initialization failed: {type(err).__name__}: {err}"
        self._initialized = True
        gpu = None
        try:
            for gpu in self.gpu_indices:
                self._devices.append(self._probe_device(gpu))
            self._choose_metric()
        except nvml.NVMLError as err:
            return f"GPU {gpu}: {_describe(err)}"
        except Exception as err:
            return f"GPU {gpu}: {type(err).__name__}: {err}"
        return None

    def _probe_device(self, gpu: int) -> _Device:
        """Get the handle and find which quantities this GPU reports, so the sampling loop
        skips the unsupported ones instead of treating them as errors."""
        nvml = self._nvml
        dev = _Device(index=gpu, handle=self._handle(gpu))
        h = dev.handle
        dev.has_memory = self._supported(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        dev.has_sm_clock = self._supported(
            lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
        )
        dev.has_mem_clock = self._supported(
            lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
        )
        dev.has_power = self._supported(lambda: nvml.nvmlDeviceGetPowerUsage(h))
        dev.has_utilization = self._supported(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        return dev

    def _handle(self, gpu: int) -> Any:
        """The NVML handle of ``gpu`` (an NVML index, or a CUDA ordinal of this process)."""
        nvml = self._nvml
        if self.index_kind == "nvml":
            return nvml.nvmlDeviceGetHandleByIndex(gpu)
        bus_id = self._pci_bus_id_of(gpu)
        if bus_id is not None:
            get = getattr(nvml, "nvmlDeviceGetHandleByPciBusId_v2", None)
            get = get or nvml.nvmlDeviceGetHandleByPciBusId
            return get(bus_id)
        entry = visible_device(gpu)
        if isinstance(entry, str):
            return nvml.nvmlDeviceGetHandleByUUID(entry)
        return nvml.nvmlDeviceGetHandleByIndex(entry)

    def _supported(self, read: Callable[[], object]) -> bool:
        """False if NVML says "Not Supported"; any other NVML error propagates."""
        nvml = self._nvml
        not_supported = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED_DEFAULT)
        try:
            read()
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == not_supported:
                return False
            raise
        return True

    def _choose_metric(self) -> None:
        """GPM on every GPU, or the memory-controller busy percentage on every GPU: one metric
        per result, since the two are different quantities."""
        why_not = self._open_gpm()
        if why_not is None:
            self._metric = METRIC_GPM
            return
        self.gpm_fallback_reason = why_not
        self._close_gpm()
        self._metric = METRIC_MC_BUSY

    def _open_gpm(self) -> str | None:
        nvml = self._nvml
        for dev in self._devices:
            try:
                support = nvml.nvmlGpmQueryDeviceSupport(dev.handle)
                if not support.isSupportedDevice:
                    return f"GPU {dev.index}: GPM not supported"
                dev.gpm = _GpmRing(nvml, dev.handle, self._gpm_min_window_s)
                dev.gpm.take()  # the first sample: checks GPM works and opens the first window
            except AttributeError as err:  # an nvidia-ml-py too old to have GPM
                return f"GPM not in this nvidia-ml-py: {err}"
            except nvml.NVMLError as err:  # old driver, MIG, profiling not permitted, ...
                return f"GPU {dev.index}: GPM: {_describe(err)}"
        return None

    def _close_gpm(self) -> None:
        for dev in self._devices:
            if dev.gpm is not None:
                dev.gpm.close()
                dev.gpm = None

    def _release(self) -> None:
        self._close_gpm()
        if self._initialized:
            self._initialized = False
            # Shutting down after a lost GPU may fail; there is nothing more to do about it.
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    # -- sampling ----------------------------------------------------------------------------

    def _run(self) -> None:
        nvml = self._nvml
        try:
            while not self._stop_event.is_set():
                tick_start = time.perf_counter()
                for dev in self._devices:
                    sample = self._read(dev)
                    with self._lock:
                        self._samples.append(sample)
                # Timed from this tick's start, not a fixed grid: a late tick (busy machine)
                # is never followed by a catch-up tick sooner than asked.
                self._stop_event.wait(max(0.0, tick_start + self.interval_s - time.perf_counter()))
        except nvml.NVMLError as err:  # e.g. "GPU is lost": stop, keep the samples taken
            self._error = _describe(err)
        except Exception as err:
            self._error = f"{type(err).__name__}: {err}"

    def _read(self, dev: _Device) -> TelemetrySample:
        nvml, h = self._nvml, dev.handle
        t_s = float(self._clock())
        if dev.gpm is not None:
            dram, sm = dev.gpm.take()
        elif dev.has_utilization:
            util = nvml.nvmlDeviceGetUtilizationRates(h)
            dram, sm = float(util.memory), float(util.gpu)
        else:
            dram = sm = None
        mem = nvml.nvmlDeviceGetMemoryInfo(h).used if dev.has_memory else None
        sm_clock = nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) if dev.has_sm_clock else None
        mem_clock = (
            nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM) if dev.has_mem_clock else None
        )
        power_mw = nvml.nvmlDeviceGetPowerUsage(h) if dev.has_power else None
        return TelemetrySample(
            t_s=t_s,
            gpu=dev.index,
            dram_bw_util_pct=dram,
            sm_util_pct=sm,
            memory_used_bytes=None if mem is None else int(mem),
            sm_clock_mhz=None if sm_clock is None else int(sm_clock),
            mem_clock_mhz=None if mem_clock is None else int(mem_clock),
            power_w=None if power_mw is None else power_mw / MILLIWATTS_PER_WATT,
        )
