"""The torch backend's decode buckets on a CPU: how rows are cut (by a hand-computed case), and
that many rows cut into many buckets of every size still equal the reference."""

from __future__ import annotations

import pytest
import torch
from paged_batches import assert_close, make_batch, run_backend

from cbbench.kernels import torch_native
from cbbench.kernels.torch_native import _buckets

SCALE = 32**-0.5


def test_buckets_cap_rows_and_padded_key_bytes(monkeypatch):
    # block 16, 2 kv heads x 8 dims x fp32 = 64 bytes per key; a cap of 64 padded keys.
    cache = torch.zeros(4, 16, 2, 8)
    monkeypatch.setattr(torch_native, "DECODE_BUCKET_BYTES", 64 * 64)
    monkeypatch.setattr(torch_native, "DECODE_BUCKET_ROWS", 3)
    seq_lens = [1, 16, 17, 5, 3, 40, 100, 2, 2]
    order = sorted(range(len(seq_lens)), key=seq_lens.__getitem__)  # 1 2 2 3 5 16 17 40 100
    # Padded to whole blocks the longest row of each bucket is 16 | 16 | 32 (with 40: 2 x 48 =
    # 96 keys > 64) | 48 | 112 (one row over the cap still gets its bucket).
    assert [[seq_lens[i] for i in b] for b in _buckets(order, seq_lens, cache)] == [
        [1, 2, 2], [3, 5, 16], [17], [40], [100]
    ]  # fmt: skip
    # Off the CPU only the row count cuts.
    meta = torch.zeros(4, 16, 2, 8, device="meta")
    assert [len(b) for b in _buckets(order, seq_lens, meta)] == [3, 3, 3]


@pytest.mark.parametrize("cap_keys", [16, 48, 10**6])
@pytest.mark.parametrize("mixed", [False, True])
def test_many_buckets_match_the_reference(monkeypatch, cap_keys, mixed):
    """70 decode rows of 1-300 keys (and, mixed, two prefill chunks among them) cut into
    buckets of one row up to DECODE_BUCKET_ROWS, every one against the reference."""
    monkeypatch.setattr(torch_native, "DECODE_BUCKET_BYTES", cap_keys * 2 * 32 * 4)
    gen = torch.Generator().manual_seed(cap_keys)
    context = torch.randint(0, 300, (70,), generator=gen).tolist()
    query_lens = [1] * 70
    if mixed:
        query_lens[10], query_lens[40] = 9, 4
    batch = make_batch(query_lens, context, 16, 2, torch.float32, seed=cap_keys)
    assert_close(
        run_backend("torch", batch, SCALE), run_backend("reference", batch, SCALE), torch.float32
    )


@pytest.mark.parametrize("mixed", [False, True])
def test_layers_share_one_decode_plan(mixed):
    """Every layer of a forward gets the same metadata: the decode rows' order, buckets, block
    lists and masks are built by the first layer and reused by the next (the same object, and
    the same output bit for bit), and rebuilt for a cache they do not fit (another dtype)."""
    query_lens = [1] * 40
    if mixed:
        query_lens[7] = 5
    context = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    batch = make_batch(query_lens, context, 16, 2, torch.float32, seed=1)
    backend = torch_native.TorchBackend()
    first = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, SCALE)
    plan = batch.metadata.__dict__["_decode_plan"]
    assert len(plan.buckets) >= 1 and plan.rows.numel() == 40 - int(mixed)
    second = backend.forward(
        batch.query, batch.k_cache.clone(), batch.v_cache.clone(), batch.metadata, SCALE
    )
    assert batch.metadata.__dict__["_decode_plan"] is plan
    assert torch.equal(first, second)
    assert_close(first, run_backend("reference", batch, SCALE), torch.float32)
    wide = backend.forward(
        batch.query.double(), batch.k_cache.double(), batch.v_cache.double(), batch.metadata,
        SCALE,
    )
    assert batch.metadata.__dict__["_decode_plan"] is not plan
    assert_close(wide.float(), first, torch.float32)
