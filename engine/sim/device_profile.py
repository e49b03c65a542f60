"""Device profiles: a calibrated device for the roofline (``--gpu-profile PROFILE.json``).

``cbbench calibrate`` fits a profile to a real run's iteration records; this module reads one
back for the engine. The engine needs only the device, the dtype and model it was fitted on,
and ``rates`` (the DeviceRates the roofline uses: fitted values, and for a parameter the data
could not identify, what the profile says to use instead — see the profile's ``params``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..model_config import DTYPE_BYTES
from .cost_model import DeviceRates
from .gpu_specs import GPU_SPECS

PROFILE_KIND = "cbbench-device-profile"
PROFILE_VERSION = 1
CPU_DEVICE = "cpu"  # a profile of the CPU the torch engine ran on (no spec: rates only)
# The step a profile's rates are checked on at load: no device runs it in less than a
# microsecond (it reads 16 GB of weights) or more than a day (a CPU takes seconds to minutes;
# a day is also the longest step calibrate reads as a measurement, so every profile it fits
# from a slow device still loads).
REFERENCE_MODEL = "llama-3-8b"
REFERENCE_CONTEXT = 1024
MIN_REFERENCE_STEP_S = 1e-6
MAX_REFERENCE_STEP_S = 86400.0


@dataclass(frozen=True)
class DeviceProfile:
    device: str  # "cpu" or a GPU spec name (h100, h200, ...)
    device_name: str  # as the run reported it
    dtype: str
    models: tuple[str, ...]
    rates: DeviceRates
    # The residual spread as step-time factors per iteration class (engine/sim/sim_bounds.py):
    # {class: {"low", "high"}}; None when the profile records no residuals.
    spread: dict | None = None

    @property
    def is_cpu(self) -> bool:
        return self.device == CPU_DEVICE


def profile_to_dict(profile: DeviceProfile) -> dict:
    """The fields the engine reads (the calibrator adds the fit's story beside them)."""
    return {
        "kind": PROFILE_KIND,
        "version": PROFILE_VERSION,
        "device": profile.device,
        "device_name": profile.device_name,
        "dtype": profile.dtype,
        "models": list(profile.models),
        "rates": profile.rates.to_dict(),
    }


def _optional_rate(rates: dict, name: str, where: str) -> float | None:
    return None if rates.get(name) is None else _rate(rates, name, where)


def _rate(rates: dict, name: str, where: str) -> float:
    v = rates.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: rates.{name} must be a number >= 0, got {v!r}")
    return float(v)


def load_profile(path: str | Path) -> DeviceProfile:
    """Read and check a profile; ValueError with a one-line reason when it is not one."""
    where = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"device profile not found: {where}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read device profile {where}: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ValueError(f"{where} is not a device profile (make one with cbbench calibrate)")
    version = data.get("version")
    if type(version) is not int or version != PROFILE_VERSION:  # true == 1 in Python
        raise ValueError(
            f"{where} has profile version {data.get('version')!r}; this cbbench reads "
            f"version {PROFILE_VERSION}"
        )
    device = data.get("device")
    if device != CPU_DEVICE and device not in GPU_SPECS:
        raise ValueError(f"{where}: unknown device {device!r}")
    rates = data.get("rates")
    if not isinstance(rates, dict):
        raise ValueError(f"{where}: no 'rates' section")
    optional = {"memory_bandwidth", "flop_rate"}
    given = {
        f.name: _rate(rates, f.name, where)
        for f in fields(DeviceRates)
        if f.name in rates and f.name not in optional
    }
    device_rates = replace(
        DeviceRates(
            _optional_rate(rates, "memory_bandwidth", where),
            _optional_rate(rates, "flop_rate", where),
        ),
        **given,
    )
    for rate in ("decode_attention_efficiency", "prefill_attention_efficiency", "host_factor"):
        if not getattr(device_rates, rate) > 0:
            raise ValueError(f"{where}: rates.{rate} must be > 0")
    models = data.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ValueError(f"{where}: 'models' must be a non-empty list of model names")
    dtype = data.get("dtype")
    if not isinstance(dtype, str):
        raise ValueError(f"{where}: no 'dtype'")
    if dtype not in DTYPE_BYTES:  # was a KeyError where the cost model looked it up
        raise ValueError(f"{where}: unknown dtype {dtype!r}: use {', '.join(DTYPE_BYTES)}")
    device_name = data.get("device_name", device)
    if not isinstance(device_name, str):
        raise ValueError(f"{where}: 'device_name' must be a string, got {device_name!r}")
    _check_reference_step(device_rates, dtype, where, models[0])
    if device != CPU_DEVICE:
        _check_physics_floor(device_rates, dtype, where, models[0], device)
    return DeviceProfile(device=device, device_name=device_name, dtype=dtype, models=tuple(models),
                         rates=device_rates, spread=_spread(data, where))


def _check_reference_step(rates: DeviceRates, dtype: str, where: str, profiled: str) -> None:
    """Each rate may be in range while the step they predict together is not: a bandwidth of
    1e-300 B/s or an overhead of 1e300 s gave a run "completed, duration 0.000 s, TTFT nan"
    in the simulator and killed `serve`'s engine on its first request. So the time of a
    reference step must be a time a step can take.

    Too fast is judged on REFERENCE_MODEL (no device reads 16 GB in a microsecond), too slow
    on the profiled model (``models[0]``, when it is a preset): a CPU profile fitted on the
    tiny model in fp32 on a loaded 2-core machine has a bandwidth of ~20 MB/s, at which an 8B
    model's 1024-token prefill takes over an hour, so judging it by llama-3-8b refused a sound
    profile (the GPU check's CPU smoke run: its static step exited 2 under load, issue 35
    item 2), while the tiny model's own step takes milliseconds."""
    from ..model_config import MODEL_PRESETS
    from .cost_model import CostModel
    from .physics_floor import reference_steps

    reference = MODEL_PRESETS[REFERENCE_MODEL]
    own = MODEL_PRESETS.get(profiled, reference)
    steps = reference_steps(REFERENCE_CONTEXT)
    for bound, model in (("low", reference), ("high", own)):
        cost = CostModel(model, dtype, rates=rates)
        for what, shape in steps.items():
            t = cost.cost(shape).time_s
            t = math.nan if t is None else t
            ok = t >= MIN_REFERENCE_STEP_S if bound == "low" else t <= MAX_REFERENCE_STEP_S
            if not ok or math.isnan(t):
                raise ValueError(
                    f"{where}: its rates predict {t:.3g} s for {what} of {model.name}; a "
                    f"device's step takes between {MIN_REFERENCE_STEP_S:g} s and "
                    f"{MAX_REFERENCE_STEP_S:g} s"
                )


def _check_physics_floor(rates: DeviceRates, dtype: str, where: str, profiled: str,
                         device: str) -> None:
    """A GPU profile's reference steps take at least what the GPU's spec allows at 100% of its
    peaks (engine/sim/physics_floor.py). A profile fitted with a host factor below 1 (a trace
    faster than the part, or one made by hand) predicted a batch-1 decode of llama-3-8b in
    3.13 ms, where an H100 cannot read its 15 GB in under 4.5 ms, and the simulator ran on
    it: the run's figures were those of no device."""
    from ..model_config import MODEL_PRESETS
    from .physics_floor import FLOOR_RTOL, reference_checks

    gpu = GPU_SPECS[device]
    reference = MODEL_PRESETS[REFERENCE_MODEL]
    models = (reference, MODEL_PRESETS.get(profiled, reference))
    worst = min(reference_checks(rates, gpu, dtype, models, REFERENCE_CONTEXT),
                key=lambda c: c.ratio)
    if worst.ratio < 1 - FLOOR_RTOL:
        raise ValueError(
            f"{where}: its rates predict {worst.predicted_s * 1e3:.3g} ms for {worst.what} of "
            f"{worst.model}, faster than the {device}'s floor of {worst.floor_s * 1e3:.3g} ms "
            f"(its peak {gpu.hbm_bandwidth / 1e12:g} TB/s and "
            f"{(gpu.peak_flops(dtype) or gpu.bf16_flops) / 1e12:g} "
            f"TFLOP/s, no overhead): no such device (host_factor {rates.host_factor:g}); "
            "recalibrate with this cbbench"
        )


def _spread(data: dict, where: str) -> dict | None:
    """The profile's ``spread`` (written by calibrate), else derived from its ``residuals``
    (profiles from before the field); None when it has neither."""
    from .sim_bounds import CLASSES, spread_from_residuals

    spread = data.get("spread")
    if spread is None:
        residuals = data.get("residuals")
        if not isinstance(residuals, dict):
            return None
        try:
            return spread_from_residuals(residuals) or None
        except (TypeError, AttributeError):
            raise ValueError(f"{where}: 'residuals' is malformed") from None
    if not isinstance(spread, dict):
        raise ValueError(f"{where}: 'spread' must be an object")
    out = {}
    for cls in CLASSES:
        band = spread.get(cls)
        if band is None:
            continue
        lo, hi = (band.get("low"), band.get("high")) if isinstance(band, dict) else (None, None)
        if not (_positive(lo) and _positive(hi)) or float(lo) > float(hi):  # type: ignore[arg-type]
            raise ValueError(f"{where}: spread.{cls} must have 0 < low <= high")
        out[cls] = {"low": float(lo), "high": float(hi)}  # type: ignore[arg-type]
    return out or None


def _positive(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
