"""GPU specifications for the simulated executor and for bandwidth/FLOP utilization.

Figures are the vendors' datasheet numbers: HBM capacity (the datasheets' "GB" of HBM is
GiB: nvidia-smi reports 81,920 MiB on an A100 80GB, 143,771 on an H200 "141GB", 183,359 on a
B200 "180GB"), peak HBM bandwidth, dense (not
sparse) bf16 tensor FLOP/s (fp16 the same on every listed part), dense FP32 FLOP/s
(FP32_FLOPS below, for fp32 runs), host<->device bandwidth (what one direction of PCIe or C2C
sustains in practice, for swap-out/in), and the GPU-to-GPU link tensor parallelism uses:
NVLink on SXM parts (per direction per GPU: NVLink 3 300 GB/s, NVLink 4 450 GB/s, NVLink 5
900 GB/s), PCIe on PCIe cards (Gen4 x16 32 GB/s, Gen5 x16 64 GB/s), with a fixed latency per
collective (a typical NCCL small-message figure, not measured here).
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
    interconnect: str = "pcie4"  # the GPU-to-GPU link: nvlink3 | nvlink4 | nvlink5 | pcie4 | pcie5
    interconnect_bandwidth: float = 32 * 1e9  # bytes/s per direction per GPU
    collective_latency_s: float = 0.0  # fixed cost of one all-reduce or all-gather

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte above which a bf16 kernel is compute-bound."""
        return self.bf16_flops / self.hbm_bandwidth

    def peak_flops(self, dtype: str = "bf16") -> float | None:
        """Dense FLOP/s a ``dtype`` model's GEMMs can reach: the bf16 tensor-core peak for bf16
        and fp16 (the same figure on every listed part), the FP32 peak (FP32_FLOPS) for fp32;
        None for fp32 on a part without a listed FP32 figure."""
        if dtype in FP32_NAMES:
            return FP32_FLOPS.get(self.name)
        return self.bf16_flops

    def to_dict(self) -> dict:
        return asdict(self)


GIB = 1024**3
US = 1e-6
# (name, per-direction bandwidth per GPU, latency per collective)
NVLINK3 = ("nvlink3", 300 * GB, 10 * US)
NVLINK4 = ("nvlink4", 450 * GB, 10 * US)
NVLINK5 = ("nvlink5", 900 * GB, 10 * US)
PCIE4 = ("pcie4", 32 * GB, 25 * US)
PCIE5 = ("pcie5", 64 * GB, 25 * US)


def _spec(name, memory, hbm, flops, host, link) -> GPUSpec:
    return GPUSpec(name, memory, hbm, flops, host, *link)


GPU_SPECS: dict[str, GPUSpec] = {
    "a100-40gb": _spec("a100-40gb", 40 * GIB, 1.555 * TB, 312 * TB, 25 * GB, NVLINK3),
    "a100-80gb": _spec("a100-80gb", 80 * GIB, 2.039 * TB, 312 * TB, 25 * GB, NVLINK3),
    "l40s": _spec("l40s", 48 * GIB, 0.864 * TB, 362 * TB, 25 * GB, PCIE4),
    "h100": _spec("h100", 80 * GIB, 3.35 * TB, 989 * TB, 50 * GB, NVLINK4),
    "h100-pcie": _spec("h100-pcie", 80 * GIB, 2.0 * TB, 756 * TB, 50 * GB, PCIE5),
    "h200": _spec("h200", 141 * GIB, 4.8 * TB, 989 * TB, 50 * GB, NVLINK4),
    "b200": _spec("b200", 180 * GIB, 8.0 * TB, 2250 * TB, 50 * GB, NVLINK5),
}


# Dense FP32 FLOP/s (the CUDA cores, not the tensor cores), from the same datasheets: A100 19.5
# TFLOP/s, L40S 91.6, H100 SXM 67, H100 PCIe 51, H200 SXM 67, HGX B200 75. An fp32 model's
# GEMMs run at this peak, not at TF32's tensor-core one (H100 SXM: 494.7 dense): PyTorch
# leaves TF32 matmul off by default (torch.backends.cuda.matmul.allow_tf32 = False,
# set_float32_matmul_precision "highest"), so fp32 matmuls take the FP32 path.
FP32_FLOPS: dict[str, float] = {
    "a100-40gb": 19.5 * TB,
    "a100-80gb": 19.5 * TB,
    "l40s": 91.6 * TB,
    "h100": 67 * TB,
    "h100-pcie": 51 * TB,
    "h200": 67 * TB,
    "b200": 75 * TB,
}


# The names torch's loader takes for fp32 (engine/torch/models/loader.py).
FP32_NAMES = frozenset({"fp32", "float32", "float"})


def gpu_names() -> list[str]:
    return sorted(GPU_SPECS)


def get_gpu_spec(name: str) -> GPUSpec:
    key = name.lower()
    if key not in GPU_SPECS:
        raise ValueError(f"unknown GPU {name!r}: choose one of {', '.join(gpu_names())}")
    return GPU_SPECS[key]


# Parts whose names hold a listed part's name but whose datasheet differs: GH200 (an H100 with
# 96 GB HBM3 at 4 TB/s, or 144 GB HBM3e), GB200, and the NVL cards (H100 NVL 94 GB at 3.9 TB/s,
# H200 NVL at a lower power limit). Given the listed part's spec, an H100 NVL's bandwidth
# utilization read 16% high and could pass 100%: no spec (no utilization) is honest.
OTHER_PARTS = ("gh200", "gb200", " nvl")


def match_device_name(device_name: str) -> GPUSpec | None:
    """Map a CUDA device name (e.g. 'NVIDIA H200') to a spec, for utilization on real runs;
    None for a part not listed (utilization is then not reported)."""
    n = device_name.lower()
    if any(other in n for other in OTHER_PARTS):
        return None
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
