"""GPU specifications for the simulated executor and for bandwidth/FLOP utilization.

Memory is the total CUDA reports (below, CUDA_TOTAL), the rest are the vendors' datasheet
numbers: peak HBM bandwidth, dense (not
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


MIB = 1024**2
# Memory is what the KV budget starts from: the device total CUDA reports (cudaMemGetInfo,
# torch.cuda.mem_get_info), as vLLM V1 budgets gpu_memory_utilization x that total. It is
# below nvidia-smi's memory.total, which is below the datasheet's "GB" (as GiB). Measured on
# one part, the H100 80GB HBM3 of the 2026-12-06 GPU check: CUDA total 79.2 GiB against
# nvidia-smi's 81,559 MiB, 458 MiB less. Every part's total here is its nvidia-smi figure less
# that same gap (one rule; only the H100's is measured). Check on another part: an
# A100-SXM4-40GB's deviceQuery total, 40,339 MB, is 0.4% under this rule's figure.
H100_CUDA_TOTAL_GIB = 79.2
H100_NVIDIA_SMI_MIB = 81_559
NVIDIA_SMI_TO_CUDA_GAP_MIB = H100_NVIDIA_SMI_MIB - H100_CUDA_TOTAL_GIB * 1024


def cuda_total(nvidia_smi_mib: int) -> int:
    """The bytes CUDA reports as the device total, from nvidia-smi's memory.total (MiB)."""
    return round((nvidia_smi_mib - NVIDIA_SMI_TO_CUDA_GAP_MIB) * MIB)


# nvidia-smi's memory.total (MiB) per part, as published runs print it (ECC on, the default).
NVIDIA_SMI_MIB = {
    "a100-40gb": 40_960,  # A100-SXM4-40GB: 40 GiB
    "a100-80gb": 81_920,  # A100-SXM4-80GB: 80 GiB
    "l40s": 46_068,  # "48GB" GDDR6, less the ECC reservation
    "h100": H100_NVIDIA_SMI_MIB,  # H100 80GB HBM3 (SXM); the 2026-12-06 run's device
    "h100-pcie": 81_559,  # H100 PCIe "80GB"
    "h200": 143_771,  # H200 "141GB": 140.4 GiB
    "b200": 183_359,  # B200 "180GB": 179.1 GiB
}
CUDA_TOTAL = {name: cuda_total(mib) for name, mib in NVIDIA_SMI_MIB.items()}


def _spec(name, hbm, flops, host, link) -> GPUSpec:
    return GPUSpec(name, CUDA_TOTAL[name], hbm, flops, host, *link)


GPU_SPECS: dict[str, GPUSpec] = {
    "a100-40gb": _spec("a100-40gb", 1.555 * TB, 312 * TB, 25 * GB, NVLINK3),
    "a100-80gb": _spec("a100-80gb", 2.039 * TB, 312 * TB, 25 * GB, NVLINK3),
    "l40s": _spec("l40s", 0.864 * TB, 362 * TB, 25 * GB, PCIE4),
    "h100": _spec("h100", 3.35 * TB, 989 * TB, 50 * GB, NVLINK4),
    "h100-pcie": _spec("h100-pcie", 2.0 * TB, 756 * TB, 50 * GB, PCIE5),
    "h200": _spec("h200", 4.8 * TB, 989 * TB, 50 * GB, NVLINK4),
    "b200": _spec("b200", 8.0 * TB, 2250 * TB, 50 * GB, NVLINK5),
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
