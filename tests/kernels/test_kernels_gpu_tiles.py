"""The Triton attention kernels with the GPU's tile sizes, under the interpreter.

The other CPU tests run the interpreter's tiles (bigger query tiles, smaller key tiles); the
tiles a GPU compiles are checked here, at the head dims the real models use, so an indexing
bug that only the GPU's tile shapes hit cannot hide until the first GPU run.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from paged_batches import (  # noqa: E402
    CASES,
    TRITON_DEVICE,
    assert_close,
    batch_shapes,
    dense_attention,
    make_batch,
)

from cbbench.kernels.triton_attention import (  # noqa: E402
    GPU_FP32_TILES,
    GPU_TILES,
    INTERPRETER_TILES,
    TritonBackend,
)


def test_gpu_tiles_differ_from_interpreter_tiles():
    # else this file would test nothing new
    assert INTERPRETER_TILES not in (GPU_TILES, GPU_FP32_TILES)


def _gpu_tiles(dtype):
    return GPU_FP32_TILES if dtype == torch.float32 else GPU_TILES


@pytest.mark.parametrize(
    ("head_dim", "gqa", "dtype"),
    [(64, 8, torch.float16), (128, 4, torch.float32), (128, 1, torch.float16)],
)
@pytest.mark.parametrize("case", CASES)
def test_unified_kernel_gpu_tiles(case, head_dim, gqa, dtype):
    batch = make_batch(
        *batch_shapes(case, 16), 16, gqa, dtype, device=TRITON_DEVICE, head_dim=head_dim
    )
    backend = TritonBackend(tiles=_gpu_tiles(dtype), decode_splits=1)  # the unified kernel
    scale = head_dim**-0.5
    out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, scale)
    assert_close(out, dense_attention(batch, scale), dtype)


@pytest.mark.parametrize(
    ("head_dim", "gqa", "dtype"), [(64, 4, torch.float16), (128, 8, torch.float32)]
)
def test_split_k_gpu_tiles(head_dim, gqa, dtype):
    query_lens, context_lens = [1, 1, 1], [130, 0, 300]
    batch = make_batch(
        query_lens, context_lens, 16, gqa, dtype, device=TRITON_DEVICE, head_dim=head_dim
    )
    backend = TritonBackend(tiles=_gpu_tiles(dtype), decode_splits=3)
    scale = head_dim**-0.5
    out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, scale)
    assert_close(out, dense_attention(batch, scale), dtype)
