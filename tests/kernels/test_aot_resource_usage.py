"""The AOT compile reads each cubin's registers and spills with one cuobjdump process per
distinct cubin, not one per launch: a launch that hits Triton's JIT cache hands back the same
compiled kernel (54 of the 259 launches of tests/kernels/test_triton_aot.py)."""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("triton")

from cbbench.kernels import aot  # noqa: E402

# cuobjdump --dump-resource-usage's output for one kernel (the shape kernels/aot.py parses).
DUMP = """
Resource usage:
 Common:
  GLOBAL:11 CONSTANT[4]:8
 Function _rope_kernel:
  REG:{regs} STACK:{stack} SHARED:0 LOCAL:{local} CONSTANT[0]:656 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


@pytest.fixture
def fake_cuobjdump(monkeypatch):
    """Answers as cuobjdump would, a different count for each cubin; records each call."""
    calls: list[bytes] = []

    def run(argv, **kwargs):
        with open(argv[-1], "rb") as f:
            cubin = f.read()
        calls.append(cubin)
        n = len(cubin)
        return subprocess.CompletedProcess(argv, 0, DUMP.format(regs=n, stack=n, local=1), "")

    monkeypatch.setattr(aot.subprocess, "run", run)
    monkeypatch.setattr(aot, "_USAGE", {})
    return calls


def test_one_cuobjdump_per_distinct_cubin(fake_cuobjdump):
    a, b = b"cubin-a", b"cubin-bb"
    got = [aot._resource_usage(c) for c in (a, b, a, a, b)]
    assert got == [(7, 8), (8, 9), (7, 8), (7, 8), (8, 9)]  # (REG, STACK + LOCAL) per cubin
    assert fake_cuobjdump == [a, b]


def test_a_cubin_equal_in_content_is_the_same_cubin(fake_cuobjdump):
    # The key is the content: a fresh bytes object of a cached cubin is not dumped again.
    first = b"cubin-" + b"a"
    again = bytes(bytearray(first))
    assert again is not first
    aot._resource_usage(first)
    aot._resource_usage(again)
    assert len(fake_cuobjdump) == 1
