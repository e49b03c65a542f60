"""The GQA-packed decode kernel (kernels/triton_decode_packed.py) against the reference, under
the interpreter on the CPU (compiled on a GPU), both variants (tensor cores, the default; CUDA
cores: 1, 4, 8 rows): fp32 and fp16, GQA ratios 1, 4, 8 and 16, head dims 64 and 128, both block sizes,
ragged contexts over several key tiles, and a request without a row. Each case also checks that
the packed kernel is what ran (the unified kernel would pass the same numbers)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from paged_batches import TRITON_DEVICE, assert_close, make_batch  # noqa: E402

from cbbench.kernels import get_backend  # noqa: E402
from cbbench.kernels.triton_attention import GPU_TILES, TritonBackend  # noqa: E402
from cbbench.kernels.triton_common import intercept_launches, kernel_name  # noqa: E402
from cbbench.kernels.triton_decode_packed import MIN_DOT, packed_tile  # noqa: E402

SCALE = 0.125


def _run(batch, backend: TritonBackend) -> tuple[torch.Tensor, list[str]]:
    names = []

    def run_it(kernel, grid, args, kwargs):
        names.append(kernel_name(kernel))
        kernel[grid](*args, **kwargs)

    with intercept_launches(run_it):
        out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, SCALE)
    return out, names


def _reference(batch) -> torch.Tensor:
    backend = get_backend("reference", batch.query.device)
    return backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, SCALE)


CONTEXTS = {16: [0, 15, 31, 100, 7], 256: [0, 255, 300, 5, 40]}  # block edges, several tiles


CASES = [
    *[("packed", d, g, hd, bs) for d in (torch.float32, torch.float16) for g in (1, 4, 8, 16)
      for hd, bs in ((128, 16), (128, 256))],
    # The CUDA-core variant below 16 heads (from 16 it is the tensor-core code).
    *[("packed-cores", d, g, 128, 16) for d in (torch.float32, torch.float16) for g in (1, 4, 8)],
]  # fmt: skip


@pytest.mark.parametrize(("variant", "dtype", "gqa", "head_dim", "block_size"), CASES)
def test_packed_decode_matches_reference(variant, dtype, gqa, head_dim, block_size):
    contexts = CONTEXTS[block_size]
    q_lens = [1, 1, 1, 1, 0]  # the last request has no row this step
    batch = make_batch(q_lens, contexts, block_size, gqa, dtype, device=TRITON_DEVICE,
                       seed=gqa + head_dim, head_dim=head_dim)  # fmt: skip
    out, names = _run(batch, TritonBackend(decode_splits=1, decode_kernel=variant))
    assert names == ["_packed_decode_kernel"]
    assert_close(out, _reference(batch), dtype)


@pytest.mark.parametrize("variant", ["packed", "packed-cores"])
def test_gpu_tiles_interpreted(variant):
    """The GPU's tile sizes (64-key tiles, cut for the CUDA-core path) at a ragged batch."""
    batch = make_batch([1] * 6, [0, 1, 63, 64, 65, 400], 16, 4, torch.float16,
                       device=TRITON_DEVICE, head_dim=128)  # fmt: skip
    out, names = _run(batch, TritonBackend(tiles=GPU_TILES, decode_splits=1, decode_kernel=variant))
    assert names == ["_packed_decode_kernel"]
    assert_close(out, _reference(batch), torch.float16)


def test_the_unified_kernel_stays_selectable_and_agrees():
    batch = make_batch([1, 1, 1], [3, 40, 17], 16, 4, torch.float32, device=TRITON_DEVICE,
                       head_dim=128)
    packed, p_names = _run(batch, TritonBackend(decode_splits=1))
    unified, u_names = _run(batch, TritonBackend(decode_splits=1, decode_kernel="unified"))
    assert p_names == ["_packed_decode_kernel"] and u_names == ["_paged_attention_kernel"]
    assert_close(packed, unified, torch.float32)
    with pytest.raises(ValueError, match="decode_kernel"):
        TritonBackend(decode_kernel="fast")
    # Below head dim 128 the default keeps the unified kernel (the packed one spills there
    # under Triton 3.6 on sm_90).
    narrow = make_batch([1, 1], [3, 40], 16, 4, torch.float32, device=TRITON_DEVICE, head_dim=64)
    assert _run(narrow, TritonBackend(decode_splits=1))[1] == ["_paged_attention_kernel"]


def test_prefill_and_split_k_keep_their_kernels():
    """Only unsplit pure-decode batches take the packed kernel."""
    mixed = make_batch([1, 5], [10, 3], 16, 4, torch.float32, device=TRITON_DEVICE)
    assert _run(mixed, TritonBackend())[1] == ["_paged_attention_kernel"]
    long = make_batch([1], [2000], 16, 4, torch.float32, device=TRITON_DEVICE, num_kv_heads=1)
    names = _run(long, TritonBackend(decode_splits=4))[1]
    assert names == ["_split_decode_kernel", "_split_merge_kernel"]


def test_tile_choice():
    """Tensor cores: the group's heads padded to 16 rows. CUDA cores: exactly the group's heads
    (no padding rows below tl.dot's minimum), tensor cores from 16 heads; the core path's
    product stays at 8192 elements."""
    assert packed_tile(4, 128, 64) == (16, 64, True)  # Llama-3-8B on tensor cores
    assert packed_tile(4, 128, 64, cores=True) == (4, 16, False)  # 4 of 4 rows hold heads
    assert packed_tile(8, 128, 64, cores=True) == (8, 8, False)
    assert packed_tile(1, 128, 64, cores=True) == (1, 64, False)
    assert packed_tile(4, 64, 64, cores=True) == (4, 32, False)
    assert packed_tile(16, 128, 64, cores=True) == (16, 64, True)
    assert packed_tile(32, 64, 32) == (32, 32, True)
    assert packed_tile(MIN_DOT, 64, 32, cores=True) == (MIN_DOT, 32, True)
