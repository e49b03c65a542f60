"""Real runs' device names to datasheet specs (bandwidth and FLOP utilization read them)."""

import pytest

from cbbench.engine.sim.gpu_specs import match_device_name


@pytest.mark.parametrize("name,spec", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA B200", "b200"),
])
def test_listed_parts_get_their_spec(name, spec):
    got = match_device_name(name)
    assert got is not None and got.name == spec


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA H100 NVL",
                                  "NVIDIA H200 NVL", "NVIDIA H20"])
def test_a_part_that_only_contains_a_listed_name_gets_none(name):
    """GH200 took the H200's spec and the H100 NVL the SXM H100's (3.35 TB/s against its
    3.9): a bandwidth utilization 16% high. A part not listed gets no spec."""
    assert match_device_name(name) is None


# nvidia-smi's memory.total (MiB) on each part, as published runs print it. The datasheets'
# "80GB", "141GB" and "180GB" are all about that many GiB.
NVIDIA_SMI_MIB = {"a100-40gb": 40960, "a100-80gb": 81920, "h100": 81559, "h100-pcie": 81559,
                  "h200": 143771, "b200": 183359}


@pytest.mark.parametrize("name", sorted(NVIDIA_SMI_MIB))
def test_each_parts_memory_is_what_the_device_reports(name):
    """The simulator's KV pool is vLLM's rule on this memory (utilization x total - weights -
    activations): the H200's and B200's were written as decimal GB (141e9, 180e9 bytes), 7%
    below the device's 143,771 and 183,359 MiB, so the default simulated H200 held 51,828
    blocks of llama-3-8b where the H100's 80 GiB was read right."""
    from cbbench.engine.sim.gpu_specs import get_gpu_spec

    real = NVIDIA_SMI_MIB[name] * 2**20
    assert get_gpu_spec(name).memory_bytes == pytest.approx(real, rel=0.01)
