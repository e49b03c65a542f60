"""GPU specifications for the simulated executor and for bandwidth/FLOP utilization.

Figures are the vendors' datasheet numbers: HBM capacity, peak HBM bandwidth, dense (not
sparse) bf16 tensor FLOP/s, and host<->device bandwidth (what one direction of PCIe or C2C
sustains in practice, for swap-out/in).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    host_bandwidth: float  # bytes/s, one direction

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound."""
        return self.bf16_flops / self.hbm_bandwidth

    def to_dict(self) -> dict:
        return asdict(self)


GIB = 1024**3

GPU_SPECS: dict[str, GPUSpec] = {
    "a100-40gb": GPUSpec("a100-40gb", 40 * GIB, 1.555 * TB, 312 * TB, 25 * GB),
    "a100-80gb": GPUSpec("a100-80gb", 80 * GIB, 2.039 * TB, 312 * TB, 25 * GB),
    "l40s": GPUSpec("l40s", 48 * GIB, 0.864 * TB, 362 * TB, 25 * GB),
    "h100": GPUSpec("h100", 80 * GIB, 3.35 * TB, 989 * TB, 50 * GB),
    "h100-pcie": GPUSpec("h100-pcie", 80 * GIB, 2.0 * TB, 756 * TB, 50 * GB),
    "h200": GPUSpec("h200", 141 * GB, 4.8 * TB, 989 * TB, 50 * GB),
    "b200": GPUSpec("b200", 180 * GB, 8.0 * TB, 2250 * TB, 50 * GB),
}


def gpu_names() -> list[str]:
    return sorted(GPU_SPECS)


def get_gpu_spec(name: str) -> GPUSpec:
    key = name.lower()
    if key not in GPU_SPECS:
        raise ValueError(f"unknown GPU {name!r}: choose one of {', '.join(gpu_names())}")
    return GPU_SPECS[key]


def match_device_name(device_name: str) -> GPUSpec | None:
    """Map a CUDA device name (e.g. 'NVIDIA H200') to a spec, for utilization on real runs."""
    n = device_name.lower()
    for key, needle in (
        ("h200", "h200"),
        ("h100-pcie", "h100 pcie"),
        ("h100", "h100"),
        ("b200", "b200"),
        ("l40s", "l40s"),
        ("a100-40gb", "a100-sxm4-40gb"),
        ("a100-40gb", "a100-pcie-40gb"),
        ("a100-80gb", "a100"),
    ):
        if needle in n:
            return GPU_SPECS[key]
    return None
