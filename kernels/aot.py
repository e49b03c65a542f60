"""Compile every Triton kernel the engine launches, ahead of time for sm_80/sm_90, without a GPU.

The engine's own launch code runs on small CPU tensors shaped like the real ones while
:func:`.triton_common.intercept_launches` catches each launch; each is then compiled through
Triton's JIT (``JITFunction.warmup`` builds the same specialization a real launch would,
``do_not_specialize`` included, then ``triton.compile(ASTSource(...), target=GPUTarget(...))``)
against a stand-in driver that names the target. Triton ships ``ptxas``, so the cubin is real;
its registers and stack (spill) bytes are read with the ``cuobjdump`` Triton ships, shared
memory from the compile's metadata.

Run it in a process WITHOUT ``TRITON_INTERPRET`` (under the interpreter even Triton's own
library functions are interpreted and cannot be compiled):

    python -m cbbench.kernels.aot --cap 80 --json OUT     (tests/kernels/test_triton_aot.py does this)
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch

from .triton_common import INTERPRETED, intercept_launches, kernel_name

# Per-block shared memory limits (opt-in maximum), bytes.
SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HEAD_DIMS = (64, 128)
GQA_GROUPS = (1, 4, 8)
NUM_KV_HEADS = 8
BLOCK_SIZES = (16, 256)
# Hidden and intermediate sizes of the model presets (the norm and MLP kernels specialize on
# them), tiny CPU presets included.
HIDDEN_SIZES = (64, 128, 2048, 3584, 4096, 8192)
INTERMEDIATE_SIZES = (128, 384, 8192, 11008, 14336, 18944, 28672)
DECODE_SPLITS = 4  # any count > 1 takes the split-K path; the count is a runtime argument


@dataclass
class Row:
    kernel: str
    config: str  # the shape/dtype point that launched it
    cap: int
    regs: int
    spill_bytes: int  # per-thread stack + local memory: 0 means no register spills
    smem: int  # bytes of shared memory per block
    compiled: bool  # False: the same specialization was already compiled for this target


class _TargetDriver:
    """The three driver calls a JIT warm-up makes, answering for a GPU that is not here."""

    def __init__(self, cap: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", cap, 32)
        self.cap = cap

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return self.cap  # one JIT cache per target

    def get_current_stream(self, device=None) -> int:
        return 0


@contextmanager
def target(cap: int) -> Iterator[None]:
    from triton.runtime.driver import driver

    # Restore whatever was active (possibly nothing yet: reset_active() would look for a GPU).
    previous = getattr(driver, "_active", None)
    driver.set_active(_TargetDriver(cap))
    try:
        yield
    finally:
        driver._active = previous


# cuobjdump's answer per cubin (by content): a launch that hits the JIT cache returns the same
# compiled kernel, and one cuobjdump process per launch was ~4 s of the test's 259 launches.
_USAGE: dict[bytes, tuple[int, int]] = {}


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, spill bytes) of ``cubin``, read once per distinct cubin."""
    key = hashlib.sha256(cubin).digest()
    if key not in _USAGE:
        _USAGE[key] = _dump_resource_usage(cubin)
    return _USAGE[key]


def _dump_resource_usage(cubin: bytes) -> tuple[int, int]:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    if m is None:
        raise RuntimeError(f"cannot read cuobjdump's resource usage: {text!r}")
    return int(m.group(1)), int(m.group(2)) + int(m.group(3))


def compile_launches(cap: int, launches: Iterator[tuple[str, Callable[[], Any]]]) -> list[Row]:
    """Run each ``(config, fn)``'s launch code with launches compiled for ``cap``, not run."""
    from .compilation import compilation_counter

    counter = compilation_counter()
    rows: list[Row] = []
    with target(cap):
        for config, fn in launches:

            def compile_one(kernel, grid, args, kwargs, config=config):
                before = counter.count
                compiled = kernel.warmup(*args, grid=grid, **kwargs)
                regs, spill = _resource_usage(compiled.asm["cubin"])
                rows.append(
                    Row(kernel_name(kernel), config, cap, regs, spill, compiled.metadata.shared,
                        counter.count > before)
                )  # fmt: skip

            with intercept_launches(compile_one):
                fn()
    return rows


# ---- the matrix: what the engine can launch --------------------------------------------------


def _metadata(decode: bool, block_size: int):
    from .metadata import build_metadata

    if decode:  # two one-row requests with cached context
        return build_metadata([1, 1], [5, 9], [[0], [1]], block_size)
    return build_metadata([3, 1], [0, 4], [[0], [1]], block_size)  # a prompt and a decode


def _layer_tensors(dtype, head_dim: int, gqa: int, num_tokens: int):
    """q/k/v as the model makes them: views into the fused qkv projection."""
    num_heads = NUM_KV_HEADS * gqa
    qkv = torch.zeros(num_tokens, (num_heads + 2 * NUM_KV_HEADS) * head_dim, dtype=dtype)
    q, k, v = qkv.split([num_heads * head_dim] + [NUM_KV_HEADS * head_dim] * 2, dim=-1)
    shape = (num_tokens, -1, head_dim)
    return q.view(shape), k.view(shape), v.view(shape)


def engine_launches() -> Iterator[tuple[str, Callable[[], Any]]]:
    """``(config, fn)`` for every kernel/shape/dtype point: ``fn`` runs the engine's launch code.

    Attention and RoPE: every dtype x head dim x GQA group at block size 16, and bf16 (the GPU
    default) at block size 256 too; the block size only changes a constant divisor there.
    "decode" is the default pure-decode path (the GQA-packed kernel on tensor cores),
    "cores-decode" its CUDA-core variant, "unified-decode" the unified kernel on a decode batch.
    """
    from .fused_rms_norm import add_rms_norm_triton, rms_norm_triton
    from .fused_rope import rope_store_kv_triton, rope_triton
    from .silu_and_mul import silu_and_mul_triton
    from .triton_attention import TritonBackend

    unified, split = TritonBackend(decode_splits=1), TritonBackend(decode_splits=DECODE_SPLITS)
    unified_decode = TritonBackend(decode_splits=1, decode_kernel="unified")
    cores_decode = TritonBackend(decode_splits=1, decode_kernel="packed-cores")
    points = [
        (d, hd, g, bs)
        for d, hd, g, bs in itertools.product(DTYPES, HEAD_DIMS, GQA_GROUPS, BLOCK_SIZES)
        if bs == BLOCK_SIZES[0] or d == "bf16"
    ]
    for dname, head_dim, gqa, block_size in points:
        dtype = DTYPES[dname]
        cache = torch.zeros(2, block_size, NUM_KV_HEADS, head_dim, dtype=dtype)
        tag = f"{dname} d{head_dim} gqa{gqa} bs{block_size}"
        phases = (("prefill", unified), ("decode", unified), ("split-k", split),
                  ("unified-decode", unified_decode), ("cores-decode", cores_decode))  # fmt: skip
        for phase, backend in phases:
            md = _metadata(phase != "prefill", block_size)
            q, _, _ = _layer_tensors(dtype, head_dim, gqa, md.num_tokens)
            q = q.contiguous()  # attention reads the rotated q, a fresh tensor
            yield (
                f"{tag} {phase}",
                partial(backend.forward, q, cache, cache, md, 0.1),
            )
        q, k, v = _layer_tensors(dtype, head_dim, gqa, 3)
        pos = torch.zeros(3, dtype=torch.int64)
        slots = torch.zeros(3, dtype=torch.int64)
        cos = torch.zeros(64, head_dim // 2)
        yield (
            f"{tag} rope+kv",
            partial(rope_store_kv_triton, q, k, v, pos, cos, cos, cache, cache, slots),
        )
        if gqa == GQA_GROUPS[0]:  # the unfused path's KV store; no query heads involved
            kr = k.contiguous()  # PyTorch's RoPE output
            yield (
                f"{tag} store-kv",
                partial(unified.write_kv, kr, v, cache, cache, slots),
            )
            if block_size == BLOCK_SIZES[0]:
                yield f"{tag} rope", partial(rope_triton, q, k, pos, cos, cos)
    for dname, hidden in itertools.product(DTYPES, HIDDEN_SIZES):
        x = torch.zeros(3, hidden, dtype=DTYPES[dname])
        w = torch.zeros(hidden, dtype=DTYPES[dname])
        yield f"{dname} hidden{hidden}", partial(rms_norm_triton, x, w, 1e-5)
        yield (
            f"{dname} hidden{hidden} +residual",
            partial(add_rms_norm_triton, x, x, w, 1e-5),
        )
    for dname, inter in itertools.product(DTYPES, INTERMEDIATE_SIZES):
        x = torch.zeros(3, 2 * inter, dtype=DTYPES[dname])
        yield f"{dname} intermediate{inter}", partial(silu_and_mul_triton, x)


def specialization_launches() -> Iterator[tuple[str, Callable[[], Any]]]:
    """One attention config launched with the per-step integers a run varies (number of
    requests, block-table width, split count) at the values Triton would specialize on (1,
    multiples of 16) and others: with ``do_not_specialize`` only the first compiles."""
    from .metadata import build_metadata
    from .triton_attention import TritonBackend

    cache = torch.zeros(40, 16, NUM_KV_HEADS, 128, dtype=torch.bfloat16)
    for num_reqs, width, splits in [(2, 3, 4), (1, 1, 1), (16, 16, 16), (17, 17, 17), (32, 32, 2)]:
        for phase in ("decode", "packed-decode", "prefill"):
            decode = phase != "prefill"
            q_lens = [1] * num_reqs if decode else [2] * num_reqs
            md = build_metadata(q_lens, [14] * num_reqs, [[0] * width] * num_reqs, 16)
            q = torch.zeros(md.num_tokens, 4 * NUM_KV_HEADS, 128, dtype=torch.bfloat16)
            backend = TritonBackend(decode_splits=max(2, splits) if phase == "decode" else 1)
            yield (
                f"num_reqs={num_reqs} width={width} splits={max(2, splits)} {phase}",
                partial(backend.forward, q, cache, cache, md, 0.1),
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cap", type=int, required=True, choices=sorted(SMEM_LIMIT))
    parser.add_argument("--json", required=True, help="where to write the rows")
    parser.add_argument("--configs", default=None,
                        help="only the launch points whose config ends with this (e.g. ' decode')")
    args = parser.parse_args(argv)
    if INTERPRETED:
        print(
            "error: unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr
        )
        return 2
    import triton

    t0 = time.perf_counter()
    points = engine_launches()
    spec_points = specialization_launches()
    if args.configs is not None:
        points = ((c, f) for c, f in points if c.endswith(args.configs))
        spec_points = ((c, f) for c, f in spec_points if c.endswith(args.configs))
    rows = compile_launches(args.cap, points)
    t1 = time.perf_counter()
    spec_rows = compile_launches(args.cap, spec_points)
    out = {
        "triton": triton.__version__,
        "cap": args.cap,
        "smem_limit": SMEM_LIMIT[args.cap],
        "rows": [asdict(r) for r in rows],
        "specialization_rows": [asdict(r) for r in spec_rows],
        "seconds": round(t1 - t0, 1),
    }
    with open(args.json, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
