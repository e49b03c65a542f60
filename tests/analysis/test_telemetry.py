"""GPU telemetry sampler, driven by a fake NVML module (this machine has no GPU).

The fake mirrors the parts of nvidia-ml-py's `pynvml` that the sampler calls, including the GPM
sample buffers and the c_nvmlGpmMetricsGet_t query struct, and records how it was called so the
tests can check the sampler used the API the way NVML requires.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbbench.analysis.summary.telemetry import (
    METRIC_GPM,
    METRIC_MC_BUSY,
    QUANTITIES,
    RULE_CALLER,
    RULE_MIDDLE,
    SIMULATED_GPU_REASON,
    TelemetrySample,
    summarize,
    unavailable,
    warning_line,
)
from cbbench.bench import nvml_sampler
from cbbench.bench.nvml_sampler import TelemetrySampler

FAST_S = 0.005  # sampling interval for tests that only need some samples quickly
WAIT_LIMIT_S = 3.0

# Values the fake reports; distinct so a test can tell which NVML path produced a number.
MC_BUSY_PCT = 7
UTIL_GPU_PCT = 77
MEM_USED = 40 * 2**30
SM_CLOCK = 1980
MEM_CLOCK = 2619
POWER_MW = 512_345


class FakeNVMLError(Exception):
    def __init__(self, message: str, value: int | None = None) -> None:
        super().__init__(message)
        self.value = value


class FakeMetricsGet:
    """Stands in for pynvml.c_nvmlGpmMetricsGet_t."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1 = None
        self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(4)]


class FakeNvml:
    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = FakeMetricsGet

    def __init__(
        self,
        *,
        gpm: bool = True,
        init_error: str | None = None,
        handle_error: FakeNVMLError | None = None,
        lose_gpu_after_reads: int | None = None,
        power_supported: bool = True,
    ) -> None:
        self.gpm = gpm
        self.init_error = init_error
        self.handle_error = handle_error
        self.lose_gpu_after_reads = lose_gpu_after_reads
        self.power_supported = power_supported
        self.inits = 0
        self.shutdowns = 0
        self.memory_reads = 0
        self.allocs: list[SimpleNamespace] = []
        self.freed: list[SimpleNamespace] = []
        self.gpm_seq = 0
        self.gpm_windows: list[float] = []  # seconds between the two samples of each query

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error, 12)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        if self.handle_error is not None:
            raise self.handle_error
        return SimpleNamespace(index=index)

    def nvmlDeviceGetUtilizationRates(self, handle: SimpleNamespace) -> SimpleNamespace:
        return SimpleNamespace(gpu=UTIL_GPU_PCT, memory=MC_BUSY_PCT)

    def nvmlDeviceGetMemoryInfo(self, handle: SimpleNamespace) -> SimpleNamespace:
        self.memory_reads += 1
        if self.lose_gpu_after_reads is not None and self.memory_reads > self.lose_gpu_after_reads:
            raise FakeNVMLError("GPU is lost", self.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(total=141 * 2**30, used=MEM_USED + handle.index, free=0)

    def nvmlDeviceGetClockInfo(self, handle: SimpleNamespace, kind: int) -> int:
        return SM_CLOCK if kind == self.NVML_CLOCK_SM else MEM_CLOCK

    def nvmlDeviceGetPowerUsage(self, handle: SimpleNamespace) -> int:
        if not self.power_supported:
            raise FakeNVMLError("Not Supported", self.NVML_ERROR_NOT_SUPPORTED)
        return POWER_MW

    # Handles by PCI bus id and by UUID: this fake host's GPUs, in NVML's (PCI) order.
    BUS_IDS = ("00000000:19:00.0", "00000000:3B:00.0", "00000000:5D:00.0", "00000000:9A:00.0")

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: str) -> SimpleNamespace:
        if bus_id not in self.BUS_IDS:
            raise FakeNVMLError("Not Found", 6)
        return SimpleNamespace(index=self.BUS_IDS.index(bus_id))

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> SimpleNamespace:
        return SimpleNamespace(index=int(uuid.rsplit("-", 1)[1]))

    # GPM
    def nvmlGpmQueryDeviceSupport(self, handle: SimpleNamespace) -> SimpleNamespace:
        return SimpleNamespace(version=1, isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        buf = SimpleNamespace(seq=None, t=None, handle=None)
        self.allocs.append(buf)
        return buf

    def nvmlGpmSampleFree(self, buf: SimpleNamespace) -> None:
        self.freed.append(buf)

    def nvmlGpmSampleGet(self, handle: SimpleNamespace, buf: SimpleNamespace) -> SimpleNamespace:
        self.gpm_seq += 1
        buf.seq, buf.t, buf.handle = self.gpm_seq, time.perf_counter(), handle
        return buf

    def nvmlGpmMetricsGet(self, q: FakeMetricsGet) -> FakeMetricsGet:
        assert q.version == self.NVML_GPM_METRICS_GET_VERSION
        assert q.sample1.seq < q.sample2.seq, "sample1 must be the older sample"
        assert q.sample1.handle is q.sample2.handle, "both samples must be of the same GPU"
        self.gpm_windows.append(q.sample2.t - q.sample1.t)
        for m in q.metrics[: q.numMetrics]:
            m.nvmlReturn = 0
            if m.metricId == self.NVML_GPM_METRIC_DRAM_BW_UTIL:
                m.value = 50.0 + q.sample2.seq / 1000
            elif m.metricId == self.NVML_GPM_METRIC_SM_UTIL:
                m.value = 90.0
            else:
                m.nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED
        return q


@pytest.fixture(autouse=True)
def no_gpm_min_window(monkeypatch):
    # Tests run far faster than NVML's 100 ms GPM refresh; the one test of that rule restores it.
    monkeypatch.setattr(nvml_sampler, "GPM_MIN_WINDOW_S", 0.0)


def wait_for_samples(sampler: TelemetrySampler, n: int) -> None:
    deadline = time.perf_counter() + WAIT_LIMIT_S
    while len(sampler.to_result()["samples"]) < n:
        assert time.perf_counter() < deadline, "sampler produced too few samples"
        time.sleep(FAST_S)


def run_sampler(nvml: FakeNvml, n: int = 6, **kwargs) -> dict:
    kwargs.setdefault("interval_s", FAST_S)
    with TelemetrySampler([0], nvml=nvml, **kwargs) as sampler:
        wait_for_samples(sampler, n)
    return sampler.to_result()


def assert_shape(result: dict) -> None:
    assert set(result) == {
        "available", "reason", "error", "source", "metric",
        "gpu_indices", "index_kind", "interval_s", "samples", "summary",
    }  # fmt: skip
    assert result["source"] == "nvml"
    for s in result["samples"]:
        assert list(s) == ["t_s", "gpu", *QUANTITIES, "total_energy_mj"]
    summary = result["summary"]
    extra = {"energy_consumption_j", "energy_method", "gpus"} if result["samples"] else set()
    assert set(summary) == {"window", "run", "steady", *extra}
    assert set(summary["window"]) == {"start_s", "end_s", "rule"}
    for part in ("run", "steady"):
        assert list(summary[part]) == list(QUANTITIES)
        for stats in summary[part].values():
            assert set(stats) == {"mean", "p50", "p90"}
    json.dumps(result, allow_nan=False)  # plain JSON types only


def test_sample_fields_match_quantities():
    names = [f.name for f in dataclasses.fields(TelemetrySample)]
    assert names == ["t_s", "gpu", *QUANTITIES, "total_energy_mj"]  # a counter: differenced


# (a) GPM supported
def test_gpm_supported_uses_gpm_values():
    nvml = FakeNvml(gpm=True)
    result = run_sampler(nvml)
    assert_shape(result)
    assert result["available"] is True and result["reason"] is None and result["error"] is None
    assert result["metric"] == METRIC_GPM
    values = [s["dram_bw_util_pct"] for s in result["samples"]]
    assert all(v is not None and 50.0 < v < 51.0 for v in values)  # from nvmlGpmMetricsGet
    assert all(s["sm_util_pct"] == 90.0 for s in result["samples"])
    assert MC_BUSY_PCT not in values
    s = result["samples"][0]
    assert s["memory_used_bytes"] == MEM_USED
    assert (s["sm_clock_mhz"], s["mem_clock_mhz"]) == (SM_CLOCK, MEM_CLOCK)
    assert s["power_w"] == pytest.approx(POWER_MW / 1000)
    # Every GPM buffer is reused round-robin and freed at stop; NVML is shut down once.
    assert len(nvml.allocs) <= 3
    assert {id(b) for b in nvml.freed} == {id(b) for b in nvml.allocs}
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_gpm_windows_respect_nvml_minimum(monkeypatch):
    # NVML needs > 100 ms between the two GPM samples of a query; ticking every 40 ms, each
    # reading must still span at least that, and the first ones (no window yet) are None.
    min_window = 0.1
    monkeypatch.setattr(nvml_sampler, "GPM_MIN_WINDOW_S", min_window)
    nvml = FakeNvml(gpm=True)
    with TelemetrySampler([0], interval_s=0.04, nvml=nvml) as sampler:
        deadline = time.perf_counter() + WAIT_LIMIT_S
        while len(nvml.gpm_windows) < 3:
            assert time.perf_counter() < deadline
            time.sleep(0.01)
    result = sampler.to_result()
    assert result["samples"][0]["dram_bw_util_pct"] is None  # under 100 ms after start
    assert all(w >= min_window for w in nvml.gpm_windows)
    assert len(nvml.allocs) <= 5  # bounded ring, not one buffer per tick
    assert {id(b) for b in nvml.freed} == {id(b) for b in nvml.allocs}


def test_two_gpus_are_both_sampled():
    nvml = FakeNvml(gpm=True)
    with TelemetrySampler([0, 3], interval_s=FAST_S, nvml=nvml) as sampler:
        wait_for_samples(sampler, 6)
    result = sampler.to_result()
    assert result["gpu_indices"] == [0, 3]
    assert {s["gpu"] for s in result["samples"]} == {0, 3}
    assert {s["memory_used_bytes"] for s in result["samples"] if s["gpu"] == 3} == {MEM_USED + 3}


# (b) GPM unsupported
def test_gpm_unsupported_falls_back_to_memory_controller_busy():
    nvml = FakeNvml(gpm=False)
    result = run_sampler(nvml)
    assert_shape(result)
    assert result["available"] is True
    assert result["metric"] == METRIC_MC_BUSY
    assert {s["dram_bw_util_pct"] for s in result["samples"]} == {float(MC_BUSY_PCT)}
    assert {s["sm_util_pct"] for s in result["samples"]} == {float(UTIL_GPU_PCT)}
    assert nvml.allocs == []


def test_gpm_failing_at_first_sample_falls_back():
    nvml = FakeNvml(gpm=True)

    def refuse(handle, buf):
        raise FakeNVMLError("Insufficient Permissions", 4)

    nvml.nvmlGpmSampleGet = refuse
    with TelemetrySampler([0], interval_s=FAST_S, nvml=nvml) as sampler:
        wait_for_samples(sampler, 3)
    result = sampler.to_result()
    assert result["available"] is True and result["metric"] == METRIC_MC_BUSY
    assert "Insufficient Permissions" in sampler.gpm_fallback_reason
    assert {id(b) for b in nvml.freed} == {id(b) for b in nvml.allocs}


class FakeNvmlWithoutGpm(FakeNvml):
    """An nvidia-ml-py too old to have the GPM functions."""

    def __getattribute__(self, name: str):
        if name.startswith("nvmlGpm"):
            raise AttributeError(f"module 'pynvml' has no attribute '{name}'")
        return super().__getattribute__(name)


def test_binding_without_gpm_falls_back():
    result = run_sampler(FakeNvmlWithoutGpm(gpm=True), n=3)
    assert result["available"] is True and result["metric"] == METRIC_MC_BUSY


def test_unsupported_quantity_is_none_not_an_error():
    result = run_sampler(FakeNvml(power_supported=False), n=3)
    assert result["available"] is True and result["error"] is None
    assert {s["power_w"] for s in result["samples"]} == {None}
    assert result["summary"]["run"]["power_w"] == {"mean": None, "p50": None, "p90": None}


# (c) NVML missing, or no permission
def test_nvml_missing_is_unavailable_without_raising():
    nvml = FakeNvml(init_error="NVML Shared Library Not Found")
    sampler = TelemetrySampler([0], nvml=nvml)
    sampler.start()
    sampler.stop()
    sampler.stop()  # idempotent
    result = sampler.to_result()
    assert_shape(result)
    assert result["available"] is False
    assert result["reason"] == "NVML Shared Library Not Found"
    assert result["metric"] is None and result["samples"] == []
    assert nvml.shutdowns == 0  # never initialized
    line = warning_line(result)
    assert line == "warning: GPU telemetry unavailable: NVML Shared Library Not Found"


def test_permission_error_is_unavailable_and_shuts_nvml_down():
    nvml = FakeNvml(handle_error=FakeNVMLError("Insufficient Permissions", 4))
    with TelemetrySampler([1], nvml=nvml) as sampler:
        pass
    result = sampler.to_result()
    assert result["available"] is False
    assert result["reason"] == "GPU 1: Insufficient Permissions"
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_no_gpu_indices_is_unavailable():
    with TelemetrySampler([], nvml=FakeNvml()) as sampler:
        pass
    assert sampler.to_result()["available"] is False


def test_not_started():
    result = TelemetrySampler([0], nvml=FakeNvml()).to_result()
    assert result["available"] is False and result["reason"]


# (d) NVMLError mid-run
def test_nvml_error_mid_run_keeps_samples_and_records_error():
    reads_before_loss = 5  # one read is the start-up probe
    nvml = FakeNvml(gpm=True, lose_gpu_after_reads=reads_before_loss)
    sampler = TelemetrySampler([0], interval_s=FAST_S, nvml=nvml)
    sampler.start()
    deadline = time.perf_counter() + WAIT_LIMIT_S
    while sampler._thread.is_alive():  # the thread ends by itself on the error
        assert time.perf_counter() < deadline
        time.sleep(FAST_S)
    sampler.stop()
    result = sampler.to_result()
    assert_shape(result)
    assert result["available"] is True
    assert result["error"] == "GPU is lost"
    assert len(result["samples"]) == reads_before_loss - 1
    assert result["summary"]["run"]["memory_used_bytes"]["mean"] == MEM_USED
    assert warning_line(result) == "warning: GPU telemetry stopped early: GPU is lost"
    assert nvml.shutdowns == 1


# (e) timestamps
def test_timestamps_come_from_the_injected_clock():
    step_s = 0.25
    ticks = iter(range(10_000))

    def fake_clock() -> float:
        return next(ticks) * step_s

    result = run_sampler(FakeNvml(), n=5, clock=fake_clock)
    times = [s["t_s"] for s in result["samples"]]
    assert times[:5] == [0.0, 0.25, 0.5, 0.75, 1.0]  # the clock is read once per sample


def test_timestamps_are_paced_about_interval_apart():
    interval = 0.02
    offset_s = 100.0  # a run clock that is clearly not the sampler's own
    t0 = time.perf_counter()
    result = run_sampler(
        FakeNvml(), n=8, interval_s=interval, clock=lambda: offset_s + time.perf_counter() - t0
    )
    times = np.array([s["t_s"] for s in result["samples"]])
    assert times[0] >= offset_s
    gaps = np.diff(times)
    assert (gaps >= 0).all()
    # Never faster than asked (a little jitter aside); generous above: the machine is shared.
    assert gaps.min() >= 0.5 * interval
    assert 0.9 * interval <= gaps.mean() <= 5 * interval


def test_default_clock_starts_at_zero():
    result = run_sampler(FakeNvml(), n=3)
    first = result["samples"][0]["t_s"]
    assert 0.0 <= first < 1.0


# (f) summaries
def make_samples(times, values) -> list[TelemetrySample]:
    return [
        TelemetrySample(t, 0, v, v / 2, int(v * 1e9), 1000 + int(v), 2000, v * 3)
        for t, v in zip(times, values, strict=True)
    ]


def expected(values) -> dict:
    arr = np.asarray(values, dtype=float)
    return {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
    }


def test_summary_matches_numpy_and_window_excludes_outside_samples():
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    values = [1.0, 2.0, 40.0, 41.0, 45.0, 47.0, 50.0, 3.0, 2.0, 1.0]
    summary = summarize(make_samples(times, values), window=(2.0, 6.0))
    assert summary["window"] == {"start_s": 2.0, "end_s": 6.0, "rule": RULE_CALLER}
    assert summary["run"]["dram_bw_util_pct"] == pytest.approx(expected(values))
    steady = [40.0, 41.0, 45.0, 47.0, 50.0]  # t in [2, 6], ends included
    assert summary["steady"]["dram_bw_util_pct"] == pytest.approx(expected(steady))
    assert summary["steady"]["power_w"] == pytest.approx(expected([3 * v for v in steady]))
    assert summary["steady"]["sm_clock_mhz"] == pytest.approx(
        expected([1000 + int(v) for v in steady])
    )


def test_run_figures_keep_to_the_runs_span():
    """The run's figures are over [t0, the run's end] (ninth review): a worker run's sampler
    starts up to START_MARGIN_S before t0 (negative t_s) and every sampler runs on after the
    last completion until stopped; those idle samples stay in the file, out of the figures
    (they were averaged into summary.run). The default steady window is the middle 80% of
    the run's samples, not of the idle tail's."""
    times = [-0.2, -0.1, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    values = [0.0, 0.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 0.0, 0.0]
    samples = make_samples(times, values)
    summary = summarize(samples, window=(1.0, 4.0), span=(0.0, 5.0))
    assert summary["run"]["dram_bw_util_pct"] == pytest.approx(expected(values[2:8]))
    assert summary["steady"]["dram_bw_util_pct"] == pytest.approx(expected(values[3:7]))
    middle = summarize(samples, span=(0.0, 5.0))["window"]
    assert (middle["start_s"], middle["end_s"]) == pytest.approx((0.5, 4.5))


def test_default_window_is_middle_80_percent():
    times = [10.0 + i for i in range(11)]  # span 10..20
    values = [float(i) for i in range(11)]
    summary = summarize(make_samples(times, values))
    assert summary["window"]["rule"] == RULE_MIDDLE
    assert summary["window"]["start_s"] == pytest.approx(11.0)
    assert summary["window"]["end_s"] == pytest.approx(19.0)
    assert summary["steady"]["dram_bw_util_pct"] == pytest.approx(expected(values[1:10]))


def test_window_ending_before_it_starts_is_rejected():
    with pytest.raises(ValueError):
        summarize(make_samples([0.0], [1.0]), window=(2.0, 1.0))


def test_sampler_result_summary_uses_the_window():
    ticks = iter(range(10_000))
    nvml = FakeNvml(gpm=False)
    result_sampler = TelemetrySampler(
        [0], interval_s=FAST_S, clock=lambda: float(next(ticks)), nvml=nvml
    )
    with result_sampler:
        wait_for_samples(result_sampler, 10)
    result = result_sampler.to_result(window=(2.0, 4.0))
    assert result["summary"]["window"]["rule"] == RULE_CALLER
    assert result["summary"]["steady"]["memory_used_bytes"]["mean"] == MEM_USED
    n_run = len(result["samples"])
    assert result["summary"]["run"]["mem_clock_mhz"] == pytest.approx(expected([MEM_CLOCK] * n_run))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=40))
def test_summary_equals_numpy(values):
    times = [0.1 * i for i in range(len(values))]
    summary = summarize(make_samples(times, values))
    assert summary["run"]["dram_bw_util_pct"] == pytest.approx(expected(values))


# unavailable(), warning_line()
def test_unavailable_section():
    result = unavailable(SIMULATED_GPU_REASON)
    assert_shape(result)
    assert result["available"] is False
    assert result["reason"] == "simulated GPU: nothing to sample"
    assert result["samples"] == [] and result["metric"] is None
    assert warning_line(result) is not None


def test_warning_line_is_one_line_and_none_when_fine():
    assert "\n" not in warning_line(unavailable("first line\nsecond line"))
    assert warning_line(run_sampler(FakeNvml(), n=2)) is None


# (g) the real nvidia-ml-py
def test_real_pynvml_never_raises():
    pytest.importorskip("pynvml")
    with TelemetrySampler([0], interval_s=FAST_S) as sampler:
        time.sleep(3 * FAST_S)
    result = sampler.to_result()
    assert_shape(result)
    if ctypes.util.find_library("nvidia-ml") is None:
        # A machine without the NVML library (like the CPU test machine).
        assert result["available"] is False
        assert result["reason"] == "NVML Shared Library Not Found"
        assert warning_line(result)
    elif not result["available"]:
        assert result["reason"]
    else:
        assert result["metric"] in (METRIC_GPM, METRIC_MC_BUSY)


# (h) which GPU: the engine's CUDA device, whatever CUDA_VISIBLE_DEVICES says
def _sampled_nvml_index(**kwargs) -> int:
    nvml = FakeNvml(gpm=False)
    with TelemetrySampler([0], interval_s=FAST_S, nvml=nvml, **kwargs) as sampler:
        wait_for_samples(sampler, 1)
    result = sampler.to_result()
    assert result["available"], result["reason"]
    # The fake reports memory used = MEM_USED + the NVML index of the handle it was given.
    return int(result["samples"][0]["memory_used_bytes"] - MEM_USED)


def test_cuda_device_maps_to_its_nvml_handle_by_pci_bus_id(monkeypatch):
    """CUDA_VISIBLE_DEVICES=2: the process's cuda:0 is NVML's GPU 2 (at bus 5D), not GPU 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    bus = {0: "00000000:5D:00.0"}  # what torch reports for cuda:0
    assert _sampled_nvml_index(index_kind="cuda", pci_bus_id_of=bus.get) == 2
    assert _sampled_nvml_index(index_kind="nvml") == 0  # NVML's own numbering, as asked


def test_without_torch_cuda_visible_devices_is_honoured(monkeypatch):
    no_torch = lambda i: None  # noqa: E731 - torch not loaded (or no CUDA): the env decides
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert _sampled_nvml_index(index_kind="cuda", pci_bus_id_of=no_torch) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fake-1")
    assert _sampled_nvml_index(index_kind="cuda", pci_bus_id_of=no_torch) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _sampled_nvml_index(index_kind="cuda", pci_bus_id_of=no_torch) == 0


def test_invisible_cuda_device_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with TelemetrySampler([0], nvml=FakeNvml(), index_kind="cuda",
                          pci_bus_id_of=lambda i: None) as sampler:  # fmt: skip
        pass
    result = sampler.to_result()
    assert result["available"] is False and "not visible" in result["reason"]


def test_torch_pci_bus_id_is_none_without_cuda():
    assert nvml_sampler.torch_pci_bus_id(0) is None  # this machine's torch has no CUDA device


# (g) energy and per-GPU figures (tenth review)
def energy_samples(times, energy_mj, power_w, gpu=0) -> list[TelemetrySample]:
    return [TelemetrySample(t, gpu, None, None, None, None, None, w, e)
            for t, e, w in zip(times, energy_mj, power_w, strict=True)]


def test_energy_is_the_counters_difference_over_the_runs_span():
    """NVML's nvmlDeviceGetTotalEnergyConsumption (and DCGM's TOTAL_ENERGY_CONSUMPTION) is mJ
    since driver load: the run's energy is its difference over the run's samples, not the
    sampled power integrated (here 999 W would give 1998 J), and per output token beside."""
    from cbbench.analysis.summary.telemetry import (
        ENERGY_COUNTER,
        add_energy_per_output_token,
        section,
    )
    from cbbench.analysis.table import telemetry_line

    times = [-0.1, 0.0, 1.0, 2.0, 3.0]  # the first and last are outside the run's span
    samples = energy_samples(times, [100.0, 1000.0, 251000.0, 501000.0, 900000.0], [999.0] * 5)
    tel = section(available=True, reason=None, error=None, metric=METRIC_MC_BUSY,
                  gpu_indices=[0], interval_s=1.0, samples=samples, window=None,
                  span=(0.0, 2.5))
    add_energy_per_output_token(tel, 1000)
    summary = tel["summary"]
    assert summary["energy_consumption_j"] == pytest.approx(500.0)  # (501000 - 1000) mJ
    assert summary["energy_method"] == ENERGY_COUNTER
    assert summary["energy_per_output_token_j"] == pytest.approx(0.5)
    assert summary["gpus"][0]["energy_consumption_j"] == pytest.approx(500.0)
    assert "GPU energy over the run: 500.0 J (counter), 0.5 J per output token" in \
        telemetry_line(tel)


def test_energy_without_the_counter_integrates_the_power():
    """A GPU without the counter (pre-Volta, NOT_SUPPORTED): trapezoids under its power."""
    from cbbench.analysis.summary.telemetry import ENERGY_POWER

    summary = summarize(energy_samples([0.0, 1.0, 2.0], [None] * 3, [100.0, 200.0, 300.0]))
    assert summary["energy_consumption_j"] == pytest.approx(150.0 + 250.0)
    assert summary["energy_method"] == ENERGY_POWER


class FakeNvmlWithEnergy(FakeNvml):
    """A Volta-or-newer GPU: its energy counter rises 1000 mJ per read."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.energy_mj = 5_000_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimpleNamespace) -> int:
        self.energy_mj += 1000
        return self.energy_mj


def test_sampler_reads_the_energy_counter_where_the_gpu_has_it():
    from cbbench.analysis.summary.telemetry import ENERGY_COUNTER, ENERGY_POWER

    result = run_sampler(FakeNvmlWithEnergy(gpm=False), n=4)
    energies = [s["total_energy_mj"] for s in result["samples"]]
    assert all(e is not None for e in energies) and energies == sorted(energies)
    summary = result["summary"]
    assert summary["energy_method"] == ENERGY_COUNTER
    assert summary["energy_consumption_j"] == pytest.approx((energies[-1] - energies[0]) / 1000)
    plain = run_sampler(FakeNvml(gpm=False), n=4)  # no counter in this binding: power instead
    assert plain["samples"][0]["total_energy_mj"] is None
    assert plain["summary"]["energy_method"] == ENERGY_POWER


def test_two_gpus_have_their_own_figures_beside_the_pooled_ones():
    """AIPerf reports each GPU: a busy GPU 0 and an idle GPU 1 read as one half-busy GPU
    when pooled (the pooled figure stays, for the files that read it)."""
    from cbbench.analysis.table import telemetry_line

    busy = [TelemetrySample(t, 0, 80.0, 90.0, None, None, None, 600.0) for t in (0.0, 1.0)]
    idle = [TelemetrySample(t, 1, 0.0, 10.0, None, None, None, 100.0) for t in (0.0, 1.0)]
    summary = summarize(busy + idle)
    assert summary["run"]["sm_util_pct"]["mean"] == pytest.approx(50.0)
    gpus = {g["gpu"]: g for g in summary["gpus"]}
    assert gpus[0]["run"]["sm_util_pct"]["mean"] == pytest.approx(90.0)
    assert gpus[1]["run"]["sm_util_pct"]["mean"] == pytest.approx(10.0)
    assert gpus[0]["energy_consumption_j"] == pytest.approx(600.0)
    assert summary["energy_consumption_j"] == pytest.approx(700.0)
    line = telemetry_line({"available": True, "metric": "m", "summary": summary})
    assert "GPU 0 (run): HBM util mean 80.0%, SM util mean 90.0%, power mean 600 W" in line
    assert "GPU 1 (run): HBM util mean 0.0%, SM util mean 10.0%, power mean 100 W" in line
