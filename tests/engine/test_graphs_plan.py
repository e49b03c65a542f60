"""Which attention backends get decode CUDA graphs, and what the result says about it.

Capture needs a forward that never reads device data on the host. triton and flash-attn
qualify (flash-attn's KV write is sync-free, test_kernels.py's test_no_sync_write_needs_no_data;
its varlen kernel takes max_seqlen_k as a host int, baked in as max_model_len); torch and
reference copy the batch's lengths to the host every forward. Shown here without a GPU: the
plan, its reason, and the requested vs chosen backend in a run's config.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cbbench.engine import build_torch
from cbbench.engine.args import EngineArgs
from cbbench.engine.build_torch import GRAPH_CAPTURABLE_BACKENDS, _graphs_plan


def _backend(name: str):
    return SimpleNamespace(name=name)


@pytest.mark.parametrize("name", ["triton", "flash-attn"])
def test_device_only_backends_are_captured(name):
    assert name in GRAPH_CAPTURABLE_BACKENDS
    assert _graphs_plan(EngineArgs(), True, _backend(name)) == (True, None)


@pytest.mark.parametrize("name", ["torch", "reference"])
def test_host_looping_backends_run_eagerly_with_the_precise_reason(name):
    use, reason = _graphs_plan(EngineArgs(), True, _backend(name))
    assert not use
    assert reason == (
        f"the {name!r} attention backend copies the batch's lengths to the host (.tolist()) "
        "in every forward, which stream capture forbids"
    )


def test_host_looping_backends_really_read_lengths_on_the_host(monkeypatch):
    """The reason is true: their forward calls .tolist() on the metadata (the sync capture
    forbids); the device-only backends' forwards are not asked here (no GPU)."""
    import torch

    from cbbench.kernels import get_backend
    from cbbench.kernels.metadata import build_metadata

    calls = []
    real = torch.Tensor.tolist

    def spy(self):
        calls.append(tuple(self.shape))
        return real(self)

    md = build_metadata([1, 1], [3, 5], [[0], [1]], 16, device="cpu")
    q = torch.randn(2, 4, 8)
    cache = torch.randn(2, 16, 2, 8)
    for name in ("torch", "reference"):
        calls.clear()
        backend = get_backend(name, "cpu")
        monkeypatch.setattr(torch.Tensor, "tolist", spy)
        backend.forward(q, cache, cache.clone(), md, 8**-0.5)
        monkeypatch.setattr(torch.Tensor, "tolist", real)
        assert calls, name


def test_off_and_no_device_reasons():
    assert _graphs_plan(EngineArgs(cuda_graphs=False), True, _backend("triton")) == (
        False, "off (--no-cuda-graphs)")  # fmt: skip
    assert _graphs_plan(EngineArgs(), False, _backend("triton")) == (False, "no CUDA device")


def test_result_config_says_what_auto_chose_and_why_no_graphs():
    """A CPU run with --attention-backend auto: the config keeps the request and the choice,
    and why decode ran eagerly."""
    from helpers import run_spec

    from cbbench.bench.runner import execute_run

    spec = run_spec(
        workload="sharegpt", num_requests=2,
        engine=EngineArgs(engine="torch", model="tiny", attention_backend="auto", max_num_seqs=4),
    )  # fmt: skip
    config = execute_run(spec).config
    assert config.attention_backend_requested == "auto"
    assert config.attention_backend == "torch"
    assert config.cuda_graphs_effective is False
    assert config.cuda_graphs_reason == "no CUDA device"


def test_flash_attn_chosen_with_graphs_says_so(monkeypatch, notices):
    """Where auto picks flash-attn (a CUDA GPU, block size 256), graphs are planned and the
    run's notices say that this pairing is untested; built with stand-ins up to the plan."""
    class Stop(Exception):
        pass

    def stop_after_plan(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(build_torch, "_graphs_plan", lambda a, on_cuda, b: (True, None))
    import cbbench.engine.torch.models.llama as llama

    monkeypatch.setattr(llama, "allocate_kv_cache", stop_after_plan)
    monkeypatch.setattr("cbbench.kernels.get_backend", lambda *a, **k: _backend("flash-attn"))
    args = EngineArgs(engine="torch", model="tiny", attention_backend="auto", block_size=256,
                      max_num_seqs=4, device="cpu")  # fmt: skip
    with pytest.raises(Stop):
        build_torch.build_torch_engine(args)
    assert any("flash-attn (asked: auto) with decode CUDA graphs: untested" in n for n in notices)
