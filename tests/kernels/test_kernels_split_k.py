"""Split-K (flash-decoding) decode attention against the reference, and the host's split choice.

Batches are sampled over 1-256 requests and 1-8k keys so the interpreter stays fast: a long
single request (the case split-K exists for), ragged mid-size batches, a wide batch of short
contexts, and requests without a row. Splits are forced where the chooser would not split
(wide batches) so the kernels themselves are checked at every batch size.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from paged_batches import TRITON_DEVICE, assert_close, make_batch  # noqa: E402

from cbbench.kernels import get_backend  # noqa: E402
from cbbench.kernels.triton_attention import GPU_TILES, TritonBackend  # noqa: E402
from cbbench.kernels.triton_decode_split import (  # noqa: E402
    MAX_SPLITS,
    MIN_KEYS_PER_SPLIT,
    num_kv_splits,
)

SCALE = 32**-0.5


def _check(batch, backend: TritonBackend, dtype) -> None:
    expected = get_backend("reference", "cpu").forward(
        batch.query.cpu(), batch.k_cache.cpu(), batch.v_cache.cpu(), _cpu(batch.metadata), SCALE
    )
    out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, SCALE)
    assert_close(out, expected, dtype)


def _cpu(md):
    import dataclasses

    return dataclasses.replace(
        md, **{f.name: getattr(md, f.name).cpu() for f in dataclasses.fields(md)
               if isinstance(getattr(md, f.name), torch.Tensor)}
    )  # fmt: skip


def _contexts(num_reqs: int, max_len: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, max_len, (num_reqs,), generator=gen).tolist()


# (num_reqs, context lengths before the new token, forced splits or None = chosen, gqa,
# kv heads, dtype). The interpreter's cost is per program and per key tile: one kv head on the
# long cases, GPU-sized key tiles everywhere, keep this file at a few seconds.
CASES = [
    pytest.param(1, [8191], None, 4, 1, torch.float16, id="b1-8k-chosen"),
    pytest.param(1, [0], 5, 1, 2, torch.float32, id="b1-1key-5splits"),
    pytest.param(3, [0, 700, 3000], 4, 8, 1, torch.float32, id="b3-ragged-empty-splits"),
    pytest.param(7, _contexts(7, 8192, 1), None, 1, 1, torch.float16, id="b7-upto8k-chosen"),
    pytest.param(40, _contexts(40, 300, 2), 3, 4, 1, torch.float32, id="b40-3splits"),
    pytest.param(256, _contexts(256, 24, 3), 2, 1, 1, torch.float16, id="b256-2splits"),
]


@pytest.mark.parametrize(("num_reqs", "contexts", "splits", "gqa", "kv_heads", "dtype"), CASES)
def test_split_k_matches_reference(num_reqs, contexts, splits, gqa, kv_heads, dtype):
    block_size = 16
    batch = make_batch(
        [1] * num_reqs, contexts, block_size, gqa, dtype, device=TRITON_DEVICE, seed=num_reqs,
        num_kv_heads=kv_heads,
    )  # fmt: skip
    backend = TritonBackend(tiles=GPU_TILES, decode_splits=splits)
    chosen = backend.choose_decode_splits(batch.metadata, kv_heads, batch.query.device)
    assert chosen > 1, "the case must take the split-K path"
    _check(batch, backend, dtype)


def test_split_k_request_without_rows():
    """A decode-only batch where one request has no row: rows map through cu_seqlens_q."""
    batch = make_batch([1, 0, 1], [40, 7, 300], 16, 4, torch.float32, device=TRITON_DEVICE)
    _check(batch, TritonBackend(decode_splits=3), torch.float32)


def test_num_kv_splits_hand_computed():
    # batch 1, 8 kv heads, 8k context on 132 SMs: 8 programs -> ceil(132 / 8) = 17 splits
    assert num_kv_splits(1, 8, 8192, 132) == 17
    # enough programs already: no split
    assert num_kv_splits(256, 8, 8192, 132) == 1
    assert num_kv_splits(17, 8, 8192, 132) == 1  # 136 programs >= 132 SMs
    # short contexts are not split below MIN_KEYS_PER_SPLIT keys per split
    assert num_kv_splits(1, 8, MIN_KEYS_PER_SPLIT - 1, 132) == 1
    assert num_kv_splits(1, 8, 3 * MIN_KEYS_PER_SPLIT, 132) == 3
    # capped: one kv head, 64k keys would want 132
    assert num_kv_splits(1, 1, 65536, 132) == MAX_SPLITS
    assert num_kv_splits(4, 8, 8192, 108) == 4  # A100: 32 programs -> ceil(108 / 32)


def test_split_choice_needs_no_device_values():
    """The choice reads only host ints: metadata tensors on the meta device (no data) work."""
    md = make_batch([1, 1], [10, 20], 16, 1, torch.float32).metadata
    import dataclasses

    meta = dataclasses.replace(md, seq_lens=md.seq_lens.to("meta"), max_seqlen_k=8192)
    assert TritonBackend(sms=132).choose_decode_splits(meta, 8, torch.device("cpu")) == 9
