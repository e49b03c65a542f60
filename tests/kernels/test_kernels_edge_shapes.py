"""The Triton attention kernels at shapes the other kernel tests leave out, against attention in
float64: a block size of 1 (every key its own block), a GQA group that is not a power of two
(3: padded rows in every tile), a head dim over 128 (the branch that halves the tiles) and
requests without a row inside a mixed or prefill batch. Each path the backend can take is
forced: the mixed kernel, the GQA-packed decode kernel, split-K. Shapes stay small for the
interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from paged_batches import TRITON_DEVICE, assert_close, dense_attention, make_batch  # noqa: E402

from cbbench.kernels.triton_attention import TritonBackend  # noqa: E402

MIXED = ([1, 4, 1, 3], [5, 0, 9, 2])  # (query lens, context lens): decodes, a prompt, a chunk
DECODE = ([1, 1, 1], [0, 6, 19])
# Kernel paths: "mixed" keeps the unified kernel for decode rows too; the others are decode-only.
PATHS = {
    "mixed": TritonBackend(decode_splits=1, decode_kernel="unified"),
    "packed": TritonBackend(decode_splits=1, decode_kernel="packed"),
    "split": TritonBackend(decode_splits=3),
}


def _check(query_lens, context_lens, block_size, gqa, head_dim, backend, num_kv_heads=1):
    batch = make_batch(
        query_lens, context_lens, block_size, gqa, torch.float32, device=TRITON_DEVICE,
        head_dim=head_dim, num_kv_heads=num_kv_heads,
    )  # fmt: skip
    scale = head_dim**-0.5
    out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, scale)
    assert_close(out, dense_attention(batch, scale), torch.float32)


@pytest.mark.parametrize(
    ("path", "lens", "head_dim"),
    [("mixed", MIXED, 32), ("packed", DECODE, 128), ("split", DECODE, 32)],
)
def test_block_size_one(path, lens, head_dim):
    _check(*lens, 1, 2, head_dim, PATHS[path])


@pytest.mark.parametrize(
    ("path", "lens", "head_dim"),
    [("mixed", MIXED, 32), ("packed", DECODE, 128), ("split", DECODE, 32)],
)
def test_gqa_group_of_three(path, lens, head_dim):
    _check(*lens, 4, 3, head_dim, PATHS[path], num_kv_heads=2)


@pytest.mark.parametrize(
    ("path", "lens"), [("mixed", MIXED), ("packed", DECODE), ("split", DECODE)]
)
def test_head_dim_over_128_halves_the_tiles(path, lens):
    """160: padded to 256 (> WIDE_HEAD_DIM), so the tiles are halved and 96 dims masked."""
    _check(*lens, 8, 2, 160, PATHS[path])


@pytest.mark.parametrize(
    "lens",
    [([3, 0, 1, 0, 5], [4, 9, 0, 0, 2]), ([0, 6, 0, 2], [3, 0, 7, 0])],
    ids=["mixed", "prefill"],
)
def test_requests_without_rows_in_a_mixed_or_prefill_batch(lens):
    _check(*lens, 4, 2, 32, TritonBackend())
