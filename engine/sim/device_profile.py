"""Device profiles: a calibrated device for the roofline (``--gpu-profile PROFILE.json``).

``cbbench calibrate`` fits a profile to a real run's iteration records; this module reads one
back for the engine. The engine needs only the device, the dtype and model it was fitted on,
and ``rates`` (the DeviceRates the roofline uses: fitted values, and for a parameter the data
could not identify, what the profile says to use instead — see the profile's ``params``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from .cost_model import DeviceRates
from .gpu_specs import GPU_SPECS

PROFILE_KIND = "cbbench-device-profile"
PROFILE_VERSION = 1
CPU_DEVICE = "cpu"  # a profile of the CPU the torch engine ran on (no spec: rates only)


@dataclass(frozen=True)
class DeviceProfile:
    device: str  # "cpu" or a GPU spec name (h100, h200, ...)
    device_name: str  # as the run reported it
    dtype: str
    models: tuple[str, ...]
    rates: DeviceRates

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


def _rate(rates: dict, name: str, where: str, optional: bool) -> float | None:
    v = rates.get(name)
    if v is None and optional:
        return None
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
    values = {
        f.name: _rate(rates, f.name, where, f.name in optional)
        for f in fields(DeviceRates)
        if f.name in rates or f.name in optional
    }
    values = {**DeviceRates(None, None).to_dict(), **values}
    for name in ("decode_attention_efficiency", "prefill_attention_efficiency", "host_factor"):
        if not values[name] > 0:
            raise ValueError(f"{where}: rates.{name} must be > 0")
    models = data.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ValueError(f"{where}: 'models' must be a non-empty list of model names")
    dtype = data.get("dtype")
    if not isinstance(dtype, str):
        raise ValueError(f"{where}: no 'dtype'")
    return DeviceProfile(
        device=device,
        device_name=str(data.get("device_name", device)),
        dtype=dtype,
        models=tuple(models),
        rates=DeviceRates(**values),
    )
