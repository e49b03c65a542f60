"""Backend choice never picks what cannot launch or what syncs per layer.

- ``auto`` asks a probe launch of one tiny Triton kernel (cached per device) before choosing
  Triton: a launch that fails (no C compiler, no Python.h, a driver error) means ``torch``.
- The KV write that flash-attn and the PyTorch backends use on CUDA has no data-dependent
  shapes: shown on the ``meta`` device, where anything that needs the data raises.
"""

from __future__ import annotations

import pytest
import torch

from cbbench.kernels import get_backend, resolve_backend_name, triton_unavailable_reason
from cbbench.kernels.backend import write_kv_no_sync, write_kv_torch

triton = pytest.importorskip("triton")
from cbbench.kernels import triton_common, triton_probe  # noqa: E402


@pytest.fixture
def fresh_probe():
    triton_probe.launch_failure.cache_clear()
    yield
    triton_probe.launch_failure.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates CUDA on a CPU-only machine")
def test_failing_launch_makes_auto_choose_torch(monkeypatch, fresh_probe):
    # Pretend this CPU machine's triton could target CUDA, so only the probe decides.
    monkeypatch.setattr(triton_common, "check_device", lambda device: None)
    monkeypatch.setattr(triton_probe, "_launch_probe", lambda device: triton_probe.PROBE_VALUE)
    assert resolve_backend_name("auto", "cuda", block_size=16) == "triton"

    triton_probe.launch_failure.cache_clear()

    def no_compiler(device):
        raise RuntimeError("Failed to compile the launcher: cc: command not found\nmore")

    monkeypatch.setattr(triton_probe, "_launch_probe", no_compiler)
    assert resolve_backend_name("auto", "cuda", block_size=16) == "torch"
    reason = triton_unavailable_reason("cuda")
    assert reason == (
        "a Triton kernel cannot launch on cuda: RuntimeError: Failed to compile the launcher: "
        "cc: command not found"
    )
    with pytest.raises(RuntimeError, match="cannot launch"):
        get_backend("triton", "cuda")


def test_probe_is_cached(monkeypatch, fresh_probe):
    calls = []
    monkeypatch.setattr(
        triton_probe,
        "_launch_probe",
        lambda device: calls.append(device) or triton_probe.PROBE_VALUE,
    )
    for _ in range(3):
        assert triton_probe.launch_failure(torch.device("cpu")) is None
    assert len(calls) == 1


def test_probe_really_launches_here(fresh_probe):
    device = "cuda" if torch.cuda.is_available() else "cpu"  # compiled, or interpreted
    assert triton_probe.launch_failure(torch.device(device)) is None
    assert triton_unavailable_reason(device) is None


def test_wrong_value_is_a_failure(monkeypatch, fresh_probe):
    monkeypatch.setattr(triton_probe, "_launch_probe", lambda device: 0)
    assert "wrote 0" in triton_probe.launch_failure(torch.device("cpu"))


def _kv_case(slots: list[int], block_size: int = 4, num_blocks: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, 2, 8)
    caches = [torch.randn(shape, generator=gen) for _ in range(2)]
    key, value = (torch.randn(len(slots), 2, 8, generator=gen) for _ in range(2))
    return key, value, caches, torch.tensor(slots, dtype=torch.int64)


@pytest.mark.parametrize(
    "slots",
    [[3, -1, 17, 0, -1], [-1, -1, 5], [-1, -1], [9], []],
    ids=["mixed", "padding-first", "all-padding", "one", "empty"],
)
def test_no_sync_write_equals_masked_write(slots):
    key, value, caches, slot_mapping = _kv_case(slots)
    expected = [c.clone() for c in caches]
    write_kv_torch(key, value, *expected, slot_mapping)  # the CPU path: boolean masks
    write_kv_no_sync(key, value, *caches, slot_mapping)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_no_sync_write_needs_no_data():
    """On ``meta`` tensors (shapes only, no data) every op whose output shape depends on the
    data fails: the no-sync write runs there, a boolean mask does not."""
    key, value, caches, slots = _kv_case([3, -1, 17])
    key, value, slots = key.to("meta"), value.to("meta"), slots.to("meta")
    caches = [c.to("meta") for c in caches]
    write_kv_no_sync(key, value, *caches, slots)
    write_kv_torch(key, value, *caches, slots)  # off the CPU it takes the no-sync path
    with pytest.raises((RuntimeError, NotImplementedError)):
        key[slots >= 0]  # what the CPU path does: needs the data


def test_host_lengths_read_once_per_metadata(monkeypatch):
    """The torch backend's mixed-batch path loops on the host; it reads the lengths once per
    metadata object (one sync per forward on CUDA), not once per layer."""
    import dataclasses

    from cbbench.kernels import build_metadata
    from cbbench.kernels.metadata import host_lengths

    md = build_metadata([2, 1, 3], [5, 0, 1], [[0, 1], [2], [3]], block_size=4)
    reads = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or real_tolist(t))
    first = host_lengths(md)
    assert (first.cu_seqlens_q, first.query_lens, first.seq_lens) == (
        [0, 2, 3, 6],
        [2, 1, 3],
        [7, 1, 4],
    )
    for _ in range(4):  # the other layers
        assert host_lengths(md) is first
    assert len(reads) == 2  # cu_seqlens_q and seq_lens, once
    other = dataclasses.replace(md, seq_lens=md.seq_lens + 1)
    assert host_lengths(other).seq_lens == [8, 2, 5]  # a new object is read afresh
