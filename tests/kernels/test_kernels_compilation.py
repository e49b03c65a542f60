"""kernels.compilation_counter: installs Triton's post-compile hook once, counts each call,
chains a hook someone else installed, and says why when it cannot count.

That Triton really calls the hook on each new specialization is checked where kernels really
compile: tests/kernels/test_triton_aot.py (each kernel's first launch in a fresh process counts)."""

from __future__ import annotations

import types

import pytest

from cbbench.kernels import compilation
from cbbench.kernels.compilation import CompilationCounter, compilation_counter


def test_counter_is_process_wide():
    pytest.importorskip("triton")
    counter = compilation_counter()
    assert counter is compilation_counter()
    assert counter.available, counter.reason


def test_hook_counts_and_chains(monkeypatch):
    triton = pytest.importorskip("triton")
    calls = []
    monkeypatch.setattr(
        triton.knobs.runtime, "jit_post_compile_hook", lambda **kw: calls.append(kw) or "prev"
    )
    counter = compilation._install(CompilationCounter(available=False))
    assert counter.available
    hook = triton.knobs.runtime.jit_post_compile_hook
    info = types.SimpleNamespace(name="_rope_kernel", module=None, jit_function=None)
    # the keyword arguments Triton's JITFunction._call_hook passes (3.6 and 3.9 alike)
    kwargs = dict(key="k", repr="r", fn=info, compile={}, is_manual_warmup=False,
                  already_compiled=False)  # fmt: skip
    assert hook(**kwargs) == "prev"  # the previous hook still runs, its answer is kept
    hook(**kwargs)
    assert counter.count == 2 and counter.by_kernel["_rope_kernel"] == 2
    assert len(calls) == 2


def test_without_triton(monkeypatch):
    monkeypatch.setattr(compilation.importlib.util, "find_spec", lambda name: None)
    counter = compilation._install(CompilationCounter(available=False))
    assert not counter.available and counter.count == 0
    assert counter.reason == "triton is not installed"
