"""The NVML sampler: GPU telemetry read in a background thread while a benchmark runs.

A background thread reads every requested GPU each ``interval_s`` and stamps each reading with
the run's clock; :mod:`cbbench.analysis.summary.telemetry` turns the samples into the result's
section. DRAM bandwidth utilization comes from NVML's GPM counters where the GPU has them,
else the memory controller's busy percentage (one metric per result; see there).

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cbbench.analysis.summary.telemetry import METRIC_GPM, METRIC_MC_BUSY, TelemetrySample, section
from cbbench.bench.nvml_gpm import GpmRing

DEFAULT_INTERVAL_S = 0.05
# NVML documents that two nvmlGpmSampleGet calls must be more than 100 ms apart (the counters
# refresh internally at that rate), so each GPM reading spans at least this long even when the
# sampler ticks faster; the other quantities are still read every tick.
GPM_MIN_WINDOW_S = 0.1
# A thread stuck inside an NVML call (e.g. a GPU falling off the bus) must not hang the run.
JOIN_TIMEOUT_S = 5.0
MILLIWATTS_PER_WATT = 1000.0
# pynvml's NVML_ERROR_NOT_SUPPORTED, used when the injected module does not define it.
NVML_ERROR_NOT_SUPPORTED_DEFAULT = 3
NOT_STARTED_REASON = "telemetry sampler was not started"

INDEX_KINDS = ("nvml", "cuda")


def _describe(err: BaseException) -> str:
    return str(err) or type(err).__name__


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
    has_energy: bool = True
    gpm: GpmRing | None = None


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
        self._opened = False
        self._ready = False  # opened without a problem
        self._started = False
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """NVML's start-up (initialization, each GPU's probes, GPM's first sample): tens of
        milliseconds and more, so a run does it before its clock's zero (bench/runner.py's
        Telemetry.prepare), not inside its timed window. On any NVML problem, record it and
        return. start() opens the sampler where this was not called; a second call does
        nothing."""
        if self._opened:
            return
        self._opened = True
        reason = self._open()
        if reason is not None:
            self._available, self._reason = False, reason
            self._release()
            return
        self._ready = True  # available once start() starts sampling

    def start(self) -> None:
        """Start sampling (opening NVML first, where open() was not called); on any NVML
        problem, record it and return."""
        if self._started:
            raise RuntimeError("TelemetrySampler.start() called twice")
        self._started = True
        self.open()
        if self._clock_arg is None:
            t0 = time.perf_counter()
            self._clock = lambda: time.perf_counter() - t0
        if not self._ready:
            return
        self._available, self._reason = True, None
        self._thread = threading.Thread(target=self._run, name="cbbench-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and release NVML; safe to call more than once, and after open()
        alone (a run that failed before its clock started)."""
        if not (self._started or self._opened) or self._stopped:
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

    def to_result(self, window: tuple[float, float] | None = None,
                  span: tuple[float, float] | None = None) -> dict[str, Any]:
        """The JSON-ready telemetry section; `window` is the steady-state (start_s, end_s),
        `span` the run's (telemetry.summarize)."""
        with self._lock:
            samples = list(self._samples)
        return section(
            available=self._available,
            reason=self._reason,
            error=self._error,
            metric=self._metric,
            gpu_indices=self.gpu_indices,
            interval_s=self.interval_s,
            samples=samples,
            window=window,
            index_kind=self.index_kind,
            span=span,
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
        # The energy counter (Volta and newer); without it the summary integrates the power.
        energy = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)
        dev.has_energy = energy is not None and self._supported(lambda: energy(h))
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
                dev.gpm = GpmRing(nvml, dev.handle, self._gpm_min_window_s)
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
        energy_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(h) if dev.has_energy else None
        return TelemetrySample(
            t_s=t_s,
            gpu=dev.index,
            dram_bw_util_pct=dram,
            sm_util_pct=sm,
            memory_used_bytes=None if mem is None else int(mem),
            sm_clock_mhz=None if sm_clock is None else int(sm_clock),
            mem_clock_mhz=None if mem_clock is None else int(mem_clock),
            power_w=None if power_mw is None else power_mw / MILLIWATTS_PER_WATT,
            total_energy_mj=None if energy_mj is None else float(energy_mj),
        )
