"""GPU telemetry in the result: samples -> the ``telemetry`` section and its summary.

The samples come from the NVML sampler (:mod:`cbbench.bench.nvml_sampler`) or from a DCGM
exporter's page (:mod:`cbbench.bench.dcgm`, ``source: "dcgm"``), one per GPU per tick,
stamped with the run's clock so they line up with engine iterations and request events.
The headline quantity is DRAM bandwidth utilization from NVML's GPM counters (Hopper and
newer); where GPM is missing the sampler falls back to the memory controller's busy
percentage, which is a different quantity (the share of time memory was read or written at
all, not the share of peak bandwidth used), so the section names which one was measured in
``metric``. A target with no GPU, or a sampler that could not start, gives ``available:
false`` with the reason; an NVML error mid-run keeps what was sampled and is recorded in
``error``.

Energy (``summary.energy_consumption_j``, one figure per GPU under ``summary.gpus``; AIPerf's
``energy_consumption``, from the same counter) is the difference of the GPU's energy counter
(NVML's nvmlDeviceGetTotalEnergyConsumption, DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: millijoules
since the driver loaded, Volta and newer) between the first and the last sample of the run's
span; a GPU without the counter has the trapezoids under its sampled power instead, and
``energy_method`` says which. The figures cover [first sample, last sample], at most one
interval short of the span at each end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SOURCE = "nvml"
SOURCE_DCGM = "dcgm"  # a DCGM exporter's page (cbbench/bench/dcgm.py: --gpu-metrics)
METRIC_GPM = "dram_bw_util_gpm"
METRIC_MC_BUSY = "memory_controller_busy"
# DCGM_FI_PROF_DRAM_ACTIVE: the quantity GPM's DRAM bandwidth utilization reads, from DCGM.
METRIC_DCGM = "dram_active_dcgm"

# With no steady-state window from the caller, drop this share of the sampled span at each end
# (ramp-up and drain): the middle 80% is kept.
DEFAULT_STEADY_TRIM_FRACTION = 0.1
PERCENTILES = (50, 90)

# How a GPU's energy was measured: its counter's difference, or the sampled power integrated
# (a GPU without the counter); "mixed" on the total when its GPUs differ.
ENERGY_COUNTER = "counter"
ENERGY_POWER = "power_integration"
ENERGY_MIXED = "mixed"
MILLIJOULES_PER_JOULE = 1000.0

RULE_CALLER = "given by caller"
RULE_MIDDLE = "middle 80% of the sampled time span"
RULE_NO_SAMPLES = "no samples"
SIMULATED_GPU_REASON = "simulated GPU: nothing to sample"
CPU_RUN_REASON = "a CPU run: no GPU to read"

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
    # The energy counter (mJ since the driver loaded): not averaged, differenced (summarize).
    total_energy_mj: float | None = None


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


def _within(samples: Sequence[TelemetrySample], start_s: float, end_s: float) -> list[TelemetrySample]:
    return [s for s in samples if start_s <= s.t_s <= end_s]


def _energy_j(samples: Sequence[TelemetrySample]) -> tuple[float | None, str | None]:
    """One GPU's energy over its samples (time order) and how it was measured."""
    first, last = (samples[0].total_energy_mj, samples[-1].total_energy_mj) if samples \
        else (None, None)
    # A counter that went backwards was reset (driver reload): its difference means nothing.
    if first is not None and last is not None and last >= first and len(samples) > 1:
        return (last - first) / MILLIJOULES_PER_JOULE, ENERGY_COUNTER
    pts = np.array([(s.t_s, s.power_w) for s in samples if s.power_w is not None], dtype=float)
    if len(pts) < 2:
        return None, None
    t, w = pts[:, 0], pts[:, 1]
    return float(np.sum((w[1:] + w[:-1]) / 2 * np.diff(t))), ENERGY_POWER


def per_gpu(samples: Sequence[TelemetrySample]) -> list[dict[str, Any]]:
    """Each GPU's figures over the samples: pooled figures average GPUs together (a busy one
    and an idle one read as half busy). A GPU is its host, UUID and index, as a DCGM
    exporter labels it: two hosts' GPU 0 are two GPUs."""
    by_gpu: dict[tuple[str, str, int], list[TelemetrySample]] = {}
    for s in sorted(samples, key=lambda s: s.t_s):
        key = (getattr(s, "hostname", None) or "", getattr(s, "uuid", None) or "", s.gpu)
        by_gpu.setdefault(key, []).append(s)
    out = []
    for (host, uuid, gpu), own in sorted(by_gpu.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        energy, method = _energy_j(own)
        out.append({"gpu": gpu, "hostname": host or None, "uuid": uuid or None,
                    "energy_consumption_j": energy, "energy_method": method,
                    "run": _quantity_stats(own)})
    return out


def summarize(
    samples: Sequence[TelemetrySample],
    window: tuple[float, float] | None = None,
    span: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Mean, p50 and p90 of each quantity over the whole run and over the steady window.
    ``span``: the run's (t0, its end), to which the figures keep: the sampler starts before
    t0 (workers: up to START_MARGIN_S early) and stops after the client's post-run work, and
    those idle samples stay in the section's samples but are not the run's."""
    sampled = bool(samples)  # a section with nothing sampled keeps its shape
    if span is not None:
        samples = _within(samples, *span)
    win = steady_window(samples, window)
    out: dict[str, Any] = {
        "window": asdict(win),
        "run": _quantity_stats(samples),
        "steady": _quantity_stats(_within(samples, win.start_s, win.end_s)),
    }
    if sampled:
        gpus = per_gpu(samples)
        energies = [g["energy_consumption_j"] for g in gpus]
        methods = {g["energy_method"] for g in gpus}
        out["energy_consumption_j"] = None if None in energies else float(sum(energies))
        out["energy_method"] = None if None in energies else (
            methods.pop() if len(methods) == 1 else ENERGY_MIXED)
        out["gpus"] = gpus
    return out


def add_energy_per_output_token(section: dict[str, Any], output_tokens: int | None) -> None:
    """The run's GPU energy per output token (J), beside the energy (AIPerf's users derive
    it), where both are known."""
    summary = section.get("summary") or {}
    energy = summary.get("energy_consumption_j")
    if energy is not None and output_tokens:
        summary["energy_per_output_token_j"] = energy / output_tokens


def section(
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
    source: str = SOURCE,
    span: tuple[float, float] | None = None,
) -> dict[str, Any]:
    return {
        "available": available,
        "reason": reason,
        "error": error,
        "source": source,
        "metric": metric,
        "gpu_indices": [int(i) for i in gpu_indices],
        "index_kind": index_kind,  # NVML's ("nvml"), CUDA ordinals ("cuda"), DCGM's gpu labels ("dcgm")
        "interval_s": float(interval_s),
        "samples": [asdict(s) for s in samples],
        "summary": summarize(samples, window, span),
    }


def unavailable(reason: str) -> dict[str, Any]:
    """The telemetry section for a target with no GPU to sample (e.g. the simulated engine).
    Nothing was sampled, so gpu_indices is empty and interval_s is 0.0."""
    return section(
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
