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

from paged_batches import TRITON_DEVICE, assert_close, dense_attention, make_batch  # noqa: E402

from cbbench.kernels import get_backend  # noqa: E402
from cbbench.kernels.triton_attention import GPU_TILES, TritonBackend  # noqa: E402
from cbbench.kernels.triton_decode_split import (  # noqa: E402
    MAX_SPLITS,
    MIN_KEYS_PER_SPLIT,
    num_kv_splits,
    split_bounds,
    split_partials,
)

SCALE = 32**-0.5  # the reference and the kernels take the same scale at any head dim


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


@pytest.mark.parametrize("splits", [MAX_SPLITS + 1, 40, 64, 0])
def test_a_forced_split_count_the_merge_cannot_take_is_refused(splits):
    """The merge loads at most MAX_SPLITS splits: a forced count past it returned wrong
    attention with no error (max error 0.22 at 40 splits, 0.35 at 64), so it is refused, at
    construction and at the kernel's entry alike."""
    from cbbench.kernels.triton_decode_split import split_decode_attention

    with pytest.raises(ValueError, match=f"1 to {MAX_SPLITS}"):
        TritonBackend(decode_splits=splits)
    batch = make_batch([1, 1], [70, 99], 16, 4, torch.float32, device=TRITON_DEVICE)
    with pytest.raises(ValueError, match=f"1 to {MAX_SPLITS}"):
        split_decode_attention(
            batch.query, batch.k_cache, batch.v_cache, batch.metadata, SCALE, splits, 16,
            batch.metadata.block_tables,
        )  # fmt: skip


def test_the_most_splits_the_merge_takes_match_float64():
    """MAX_SPLITS forced on two short requests (most splits hold 2-4 keys, some none) against
    attention in float64: the limit itself is computed right."""
    batch = make_batch(
        [1, 1], [70, 99], 16, 4, torch.float32, device=TRITON_DEVICE, num_kv_heads=1
    )
    out = TritonBackend(decode_splits=MAX_SPLITS).forward(
        batch.query, batch.k_cache, batch.v_cache, batch.metadata, SCALE
    )
    assert_close(out, dense_attention(batch, SCALE), torch.float32)


def test_num_kv_splits_hand_computed():
    # batch 1, 8 kv heads, 8k context on 132 SMs: 8 programs -> ceil(2 x 132 / 8) = 33 splits,
    # capped at MAX_SPLITS
    assert num_kv_splits(1, 8, 8192, 132) == MAX_SPLITS == 32
    # enough programs already: no split
    assert num_kv_splits(256, 8, 8192, 132) == 1
    assert num_kv_splits(33, 8, 8192, 132) == 1  # 264 programs >= 2 x 132
    assert num_kv_splits(32, 8, 8192, 132) == 2  # 256 programs: ceil(264 / 256)
    # short contexts are not split below MIN_KEYS_PER_SPLIT keys per split
    assert num_kv_splits(1, 8, MIN_KEYS_PER_SPLIT - 1, 132) == 1
    assert num_kv_splits(1, 8, 3 * MIN_KEYS_PER_SPLIT, 132) == 3
    # capped: one kv head, 64k keys would want 264
    assert num_kv_splits(1, 1, 65536, 132) == MAX_SPLITS
    assert num_kv_splits(4, 8, 8192, 108) == 7  # A100: 32 programs -> ceil(216 / 32)


# Issue 39's table, by hand: Llama-3-8B (8 kv heads) on an H100 (132 SMs), a decode row after
# `context` cached tokens sees context + 1 keys. wanted = ceil(2 x 132 / (batch x 8)):
# 33, 3, 1, 1; by length = (context + 1) // 16: 32, 128, 512; splits = min(wanted, by length, 32).
SPLIT_TABLE = {  # (batch, context): splits
    (1, 512): 32, (1, 2048): 32, (1, 8192): 32,
    (16, 512): 3, (16, 2048): 3, (16, 8192): 3,
    (64, 512): 1, (64, 2048): 1, (64, 8192): 1,
    (256, 512): 1, (256, 2048): 1, (256, 8192): 1,
}  # fmt: skip
# Inside a CUDA graph max_seqlen_k is the model's length (8192), whatever the context: one
# fixed count per captured batch size.
GRAPH_SPLITS = {1: 32, 16: 3, 64: 1, 256: 1}
H100_SMS = 132
LLAMA3_KV_HEADS = 8


@pytest.mark.parametrize(("batch", "context"), list(SPLIT_TABLE))
def test_split_choice_at_issue_39_batches_and_contexts(batch, context):
    assert num_kv_splits(batch, LLAMA3_KV_HEADS, context + 1, H100_SMS) == SPLIT_TABLE[(batch, context)]
    assert num_kv_splits(batch, LLAMA3_KV_HEADS, 8192, H100_SMS) == GRAPH_SPLITS[batch]
    # What the engine's backend picks from the metadata it is given (graph capture: 8192).
    md = make_batch([1], [0], 16, 4, torch.float32).metadata
    import dataclasses

    md = dataclasses.replace(
        md, seq_lens=torch.zeros(batch, dtype=torch.int32, device="meta"), max_seqlen_k=8192
    )
    chosen = TritonBackend(sms=H100_SMS).choose_decode_splits(md, LLAMA3_KV_HEADS, "cpu")
    assert chosen == GRAPH_SPLITS[batch]


def _holding_keys(seq_len: int, splits: int) -> int:
    return sum(start < end for start, end in split_bounds(seq_len, splits))


def test_split_grid_covers_the_sms_at_batch_1():
    """Batch 1 at context 512 (the H100 run's case), Llama-3-8B's 8 kv heads on 132 SMs.

    Eager (max_seqlen_k = 513) and inside a graph (8192) alike the count is 32. Each split now
    takes ceil(513 / 32) = 17 keys: splits 0-29 hold 17, split 30 holds 3, split 31 none, so
    31 x 8 = 248 programs read keys, ~2 per SM. Before, each split's keys were rounded up to
    whole 64-key tiles: ceil(513 / 64) = 9 splits held keys, 72 programs on 132 SMs (60 SMs
    idle); and before that the 256-key minimum gave 2 splits eagerly (16 programs)."""
    assert num_kv_splits(1, 8, 513, 132) == num_kv_splits(1, 8, 8192, 132) == 32
    bounds = split_bounds(513, 32)
    assert bounds[0] == (0, 17) and bounds[29] == (493, 510) and bounds[30] == (510, 513)
    assert bounds[31][0] >= bounds[31][1]  # empty
    assert _holding_keys(513, 32) * 8 == 248 >= 132
    assert -(-513 // 64) * 8 == 72  # the tile-rounded split of before, for the record
    # 8k: 32 splits of 257 keys, all 256 programs hold keys.
    assert _holding_keys(8193, 32) * 8 == 256
    # Short contexts still spread: 100 keys over a graph's 32 splits -> 4 keys x 25 splits.
    assert _holding_keys(100, 32) == 25


@pytest.mark.parametrize("seq_len", [1, 16, 17, 100, 513, 8193])
@pytest.mark.parametrize("splits", [1, 3, 32])
def test_split_bounds_partition_the_keys(seq_len, splits):
    """Every key in exactly one split, in order, none longer than ceil(seq_len / splits)."""
    bounds = split_bounds(seq_len, splits)
    covered = [k for start, end in bounds for k in range(start, end)]
    assert covered == list(range(seq_len))
    assert max(end - start for start, end in bounds) == -(-seq_len // splits)


def test_split_choice_needs_no_device_values():
    """The choice reads only host ints: metadata tensors on the meta device (no data) work."""
    md = make_batch([1, 1], [10, 20], 16, 1, torch.float32).metadata
    import dataclasses

    meta = dataclasses.replace(md, seq_lens=md.seq_lens.to("meta"), max_seqlen_k=8192)
    # 2 requests x 8 kv heads = 16 programs -> ceil(264 / 16) = 17 splits
    assert TritonBackend(sms=132).choose_decode_splits(meta, 8, torch.device("cpu")) == 17


# Issue 39's interpreter matrix: every dtype (bf16 through fp32 dots, kernels/triton_dot.py), GQA
# 1/4/8, block sizes 16/32, ragged decode batches from 1 key up. The split count is the
# chooser's, on a 16-SM "GPU" so these short contexts still split (5 requests x 1 kv head:
# ceil(2 x 16 / 5) = 7 wanted, 334 // 16 = 20 by length -> 7 splits), keeping the interpreter's
# program count small; the 8k cases below take an H100's 132.
MATRIX_CONTEXTS = [0, 1, 63, 200, 333]
MATRIX_SMS = 16
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _decode_batch(contexts, block_size, gqa, dtype, head_dim=32, kv_heads=1, seed=0):
    return make_batch(
        [1] * len(contexts), contexts, block_size, gqa, dtype, device=TRITON_DEVICE, seed=seed,
        head_dim=head_dim, num_kv_heads=kv_heads,
    )  # fmt: skip


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_decode_matrix(dtype, gqa, block_size):
    batch = _decode_batch(MATRIX_CONTEXTS, block_size, gqa, dtype, seed=gqa * block_size)
    backend = TritonBackend(tiles=GPU_TILES, sms=MATRIX_SMS)
    assert backend.choose_decode_splits(batch.metadata, 1, batch.query.device) == 7
    _check(batch, backend, dtype)


@pytest.mark.parametrize(
    ("contexts", "gqa", "dtype"),
    [([8191], 8, torch.bfloat16), ([8191, 17], 1, torch.float32)],
    ids=["b1-8k-gqa8-bf16", "b2-8k-gqa1-fp32"],  # fp16 at 8k: test_split_k_matches_reference
)
def test_split_decode_long_contexts_with_h100_choice(contexts, gqa, dtype):
    """Up to 8k keys, the split count an H100 gets (MAX_SPLITS at batch 1-2)."""
    batch = _decode_batch(contexts, 16, gqa, dtype, seed=len(contexts))
    backend = TritonBackend(tiles=GPU_TILES, sms=H100_SMS)
    assert backend.choose_decode_splits(batch.metadata, 1, batch.query.device) == MAX_SPLITS
    _check(batch, backend, dtype)


@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unsplit_decode_at_llama_head_dim(dtype, gqa):
    """The unsplit pure-decode path (the GQA-packed kernel from head dim 128) at every dtype and
    GQA group, on both block sizes' boundaries: what batches of 64 and up take on an H100."""
    batch = _decode_batch([0, 15, 16, 33, 130], 16 if gqa != 4 else 32, gqa, dtype, head_dim=128)
    _check(batch, TritonBackend(tiles=GPU_TILES, decode_splits=1), dtype)


def test_each_split_covers_exactly_its_keys():
    """The first launch alone, at a graph's split count: batch 1 at context 512 (Llama-3's
    head dim and GQA group of 4) beside a 41-key request. Each split's output and log-sum-exp
    equal attention over exactly the keys ``split_bounds`` gives it, and a split without keys
    writes lse = -inf: on the device the splits cover the keys as the host's count says."""
    import dataclasses
    import math

    head_dim, gqa, dtype = 128, 4, torch.float16
    batch = _decode_batch([512, 40], 16, gqa, dtype, head_dim=head_dim, seed=5)
    md = dataclasses.replace(batch.metadata, max_seqlen_k=8192)  # as a captured graph has it
    backend = TritonBackend(tiles=GPU_TILES, sms=H100_SMS)
    splits = backend.choose_decode_splits(md, 1, batch.query.device)
    assert splits == MAX_SPLITS
    scale = head_dim**-0.5
    partial, lse = split_partials(
        batch.query, batch.k_cache, batch.v_cache, md, scale, splits, GPU_TILES.block_n_split,
        md.block_tables,
    )  # fmt: skip
    holding = 0
    for req, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True)):
        q = batch.query[req].double()  # [heads, dim]: one row per request
        for split, (start, end) in enumerate(split_bounds(k.shape[0], splits)):
            if start >= end:
                assert torch.isneginf(lse[req, :, split]).all(), (req, split)
                continue
            holding += 1
            scores = q @ k[start:end, 0].double().T * scale  # [heads, keys]
            want_lse = torch.logsumexp(scores, -1) / math.log(2)
            want = torch.softmax(scores, -1) @ v[start:end, 0].double()
            torch.testing.assert_close(lse[req, :, split].double(), want_lse, atol=1e-2, rtol=0)
            torch.testing.assert_close(
                partial[req, :, split, :head_dim].double(), want, atol=1e-2, rtol=0
            )
    assert holding == 31 + 21  # 513 keys: 17 a split; 41 keys: 2 a split (split 20: 1)
