"""Paged attention backends against the reference, and the reference against dense attention.

Caches are random, block tables are shuffled (non-contiguous block ids) and every block that no
request owns holds garbage, so a wrong gather shows up as a wrong number. Shapes stay tiny: the
Triton backend runs under its (slow) interpreter on CPU-only machines.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
from paged_batches import (
    CASES,
    HAS_CUDA,
    HEAD_DIM,
    NUM_KV_HEADS,
    TRITON_DEVICE,
    assert_close,
    batch_shapes,
    dense_attention,
    make_batch,
    run_backend,
)

from cbbench.kernels import (
    BACKEND_NAMES,
    AttentionMetadata,
    available_backends,
    build_metadata,
    get_backend,
)

GQA_RATIOS = (1, 4, 8)
BLOCK_SIZES = (16, 256)
















# ---------------------------------------------------------------------------------------------
# The oracle's oracle


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("gqa", GQA_RATIOS)
@pytest.mark.parametrize("case", CASES)
def test_reference_matches_dense(case: str, gqa: int, block_size: int) -> None:
    batch = make_batch(*batch_shapes(case, block_size), block_size, gqa, torch.float32)
    scale = HEAD_DIM**-0.5
    assert_close(
        run_backend("reference", batch, scale), dense_attention(batch, scale), torch.float32
    )


# ---------------------------------------------------------------------------------------------
# Backends against the reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("gqa", GQA_RATIOS)
@pytest.mark.parametrize("case", CASES)
def test_torch_matches_reference(case: str, gqa: int, block_size: int, dtype: torch.dtype) -> None:
    batch = make_batch(*batch_shapes(case, block_size), block_size, gqa, dtype)
    scale = HEAD_DIM**-0.5
    assert_close(run_backend("torch", batch, scale), run_backend("reference", batch, scale), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("gqa", GQA_RATIOS)
@pytest.mark.parametrize("case", CASES)
def test_triton_matches_reference(case: str, gqa: int, block_size: int, dtype: torch.dtype) -> None:
    pytest.importorskip("triton")
    batch = make_batch(
        *batch_shapes(case, block_size), block_size, gqa, dtype, device=TRITON_DEVICE
    )
    scale = HEAD_DIM**-0.5
    assert_close(run_backend("triton", batch, scale), run_backend("reference", batch, scale), dtype)


@pytest.mark.parametrize("name", ["torch", "triton"])
@pytest.mark.parametrize("head_dim", [24, 64])  # not a power of two; and a wider one
def test_head_dims(name: str, head_dim: int) -> None:
    if name == "triton":
        pytest.importorskip("triton")
    device = TRITON_DEVICE if name == "triton" else "cpu"
    batch = make_batch(
        *batch_shapes("mixed", 16), 16, 4, torch.float32, device=device, head_dim=head_dim
    )
    scale = head_dim**-0.5
    expected = run_backend("reference", batch, scale)
    assert_close(run_backend(name, batch, scale), expected, torch.float32)


@pytest.mark.parametrize(
    ("name", "seed"), [("torch", s) for s in range(4)] + [("triton", s) for s in range(2)]
)
def test_random_batches(name: str, seed: int) -> None:
    """Random ragged batches mixing every kind of row, against the dense oracle directly."""
    if name == "triton":
        pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(100 + seed)
    num_reqs = int(torch.randint(1, 7, (1,), generator=gen))
    query_lens = torch.randint(1, 12, (num_reqs,), generator=gen)
    query_lens = torch.where(torch.rand(num_reqs, generator=gen) < 0.5, 1, query_lens).tolist()
    context_lens = torch.randint(0, 40, (num_reqs,), generator=gen).tolist()
    device = TRITON_DEVICE if name == "triton" else "cpu"
    batch = make_batch(query_lens, context_lens, 16, 2, torch.float32, device=device, seed=seed)
    scale = 0.3
    assert_close(run_backend(name, batch, scale), dense_attention(batch, scale), torch.float32)


def test_write_then_attend() -> None:
    """The model's order: write this iteration's K/V into the cache, then attend over it."""
    query_lens, context_lens = batch_shapes("mixed", 16)
    batch = make_batch(query_lens, context_lens, 16, 4, torch.float32)
    new_k = torch.cat([k[c:] for k, c in zip(batch.keys, context_lens, strict=True)])
    new_v = torch.cat([v[c:] for v, c in zip(batch.values, context_lens, strict=True)])
    slots = batch.metadata.slot_mapping
    flat_k = batch.k_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)
    flat_v = batch.v_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)
    flat_k[slots] = torch.randn_like(new_k)  # stale values where the new tokens go
    flat_v[slots] = torch.randn_like(new_v)
    backend = get_backend("torch", "cpu")
    backend.write_kv(new_k, new_v, batch.k_cache, batch.v_cache, slots)
    scale = HEAD_DIM**-0.5
    out = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata, scale)
    assert_close(out, dense_attention(batch, scale), torch.float32)


# ---------------------------------------------------------------------------------------------
# write_kv


def check_write_kv(name: str, device: str, dtype: torch.dtype, block_size: int = 16) -> None:
    gen = torch.Generator().manual_seed(7)
    num_blocks, num_tokens = 5, 9
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    value = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 5]] = -1  # padding rows: must not be written
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for r, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = key[r]
            expected_v[slot // block_size, slot % block_size] = value[r]

    get_backend(name, device, block_size=block_size).write_kv(
        key, value, k_cache, v_cache, slots.to(device)
    )
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", ["reference", "torch", "triton"])
def test_write_kv(name: str, dtype: torch.dtype) -> None:
    if name == "triton":
        pytest.importorskip("triton")
    check_write_kv(name, TRITON_DEVICE if name == "triton" else "cpu", dtype)


# ---------------------------------------------------------------------------------------------
# metadata and backend selection


def test_build_metadata() -> None:
    md = build_metadata([2, 1], [3, 6], [[4, 1], [0, 2]], block_size=4)
    assert md.cu_seqlens_q.tolist() == [0, 2, 3]
    assert md.seq_lens.tolist() == [5, 7]
    assert md.cu_seqlens_k.tolist() == [0, 5, 12]
    assert (md.max_seqlen_q, md.max_seqlen_k, md.num_reqs, md.num_tokens) == (2, 7, 2, 3)
    # request 0 writes tokens 3, 4 (block 4 offset 3, block 1 offset 0); request 1 token 6
    assert md.slot_mapping.tolist() == [4 * 4 + 3, 1 * 4 + 0, 2 * 4 + 2]
    assert md.block_tables.dtype == torch.int32 and md.slot_mapping.dtype == torch.int64
    with pytest.raises(ValueError, match="cannot hold"):
        build_metadata([2, 1], [3, 16], [[4, 1], [0, 2]], block_size=4)


def test_unknown_backend_lists_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        get_backend("cudnn", "cpu")
    for name in BACKEND_NAMES:
        assert name in str(info.value)


def test_auto_and_availability_on_cpu() -> None:
    names = available_backends("cpu", block_size=16)
    assert names[:2] == ["reference", "torch"] and "flash-attn" not in names
    assert get_backend("auto", "cpu", block_size=256).name == "torch"
    assert get_backend("auto", "cpu").name == "torch"


def test_flash_attn_refuses_cpu() -> None:
    with pytest.raises(RuntimeError, match="flash-attn"):
        get_backend("flash-attn", "cpu")


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU the compiled triton path is available")
def test_triton_reason_without_gpu() -> None:
    pytest.importorskip("triton")
    # tests/conftest.py sets TRITON_INTERPRET=1 here, so CPU works and CUDA tensors do not.
    assert "triton" in available_backends("cpu")
    with pytest.raises(RuntimeError, match="triton"):
        get_backend("triton", "cuda")
    # bf16 runs interpreted with fp32 dots (kernels/triton_dot.py: the interpreter's bf16
    # tl.dot is wrong) and matches the reference, where it was refused before.
    batch = make_batch(*batch_shapes("mixed", 16), 16, 4, torch.bfloat16)
    scale = HEAD_DIM**-0.5
    assert_close(run_backend("triton", batch, scale), run_backend("reference", batch, scale),
                 torch.bfloat16)  # fmt: skip


@pytest.mark.skipif(HAS_CUDA, reason="compiled on a GPU: no interpreter")
def test_interpreter_switches_the_language_once_a_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interpreted, a launch switches triton.language to the interpreter's semantics once for
    its grid, not again on every device-function call (tl.max, tl.cdiv, attention_dot) of every
    program: Triton 3.9 does, ~4 ms each, ~40% of a split-K launch (kernels/triton_interpreter.py)."""
    pytest.importorskip("triton")
    from cbbench.kernels import triton_common, triton_interpreter

    assert triton_common.INTERPRETED
    real, calls = triton_interpreter._real_patch_lang, []
    assert real is not None  # installed when triton_common was imported

    def counting(fn):
        calls.append(fn.__name__)
        return real(fn)

    monkeypatch.setattr(triton_interpreter, "_real_patch_lang", counting)
    batch = make_batch(*batch_shapes("decode", 16), 16, 4, torch.float32)
    scale = HEAD_DIM**-0.5
    assert_close(run_backend("triton", batch, scale), run_backend("reference", batch, scale),
                 torch.float32)  # fmt: skip
    launches = [c for c in calls if c.endswith("_kernel") and c != "_probe_kernel"]
    assert launches == ["_split_decode_kernel", "_split_merge_kernel"]  # the path under test
    # Device functions: each launch switches triton.language.core (their module's) once at
    # most; hundreds of calls (programs x key tiles x calls a tile) switched it before.
    assert len([c for c in calls if not c.endswith("_kernel")]) <= len(launches)


@pytest.mark.skipif(HAS_CUDA, reason="compiled on a GPU: no interpreter")
def test_interpreter_skips_overflow_checks_it_discards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interpreted, an int32 +, - or * no longer recomputes itself in int64 to hand a verdict to
    device_assert, which drops it without debug (kernels/triton_interpreter.py); with debug on,
    the checks stay."""
    pytest.importorskip("triton")
    from triton.language import semantic
    from triton.runtime import interpreter

    from cbbench.kernels import triton_common, triton_interpreter

    assert triton_common.INTERPRETED
    options = interpreter.interpreter_builder.options
    assert not options.debug and not options.sanitize_overflow
    checks: list[str] = []
    real_assert = semantic.TritonSemantic.device_assert

    def counting(self, cond, msg, mask):
        checks.append(msg)
        return real_assert(self, cond, msg, mask)

    monkeypatch.setattr(semantic.TritonSemantic, "device_assert", counting)
    batch = make_batch(*batch_shapes("decode", 16), 16, 4, torch.float32)
    scale = HEAD_DIM**-0.5
    assert_close(run_backend("triton", batch, scale), run_backend("reference", batch, scale),
                 torch.float32)  # fmt: skip
    assert checks == []  # thousands of "int32 overflow detected" verdicts, all dropped, before
    debug = dataclasses.replace(options, debug=True, sanitize_overflow=True)
    monkeypatch.setattr(interpreter.interpreter_builder, "options", debug)
    triton_interpreter.skip_discarded_overflow_checks()
    assert interpreter.interpreter_builder.options is debug  # debug asks for them: kept


def test_flash_attn_call_with_fake_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flash-attn glue on CPU: a stand-in with flash_attn_varlen_func's signature checks
    the arguments the backend passes and computes what flash-attn documents for them."""
    calls = []

    def flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
        softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
        deterministic=False, return_attn_probs=False, block_table=None,
    ):  # fmt: skip
        calls.append(causal)
        assert causal and block_table is not None and block_table.dtype == torch.int32
        assert k.dim() == 4 and k.shape[1] % 256 == 0  # paged: [blocks, block_size, kvh, dim]
        seq_lens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
        md = AttentionMetadata(
            cu_seqlens_q, seq_lens, max_seqlen_q, max_seqlen_k, block_table,
            torch.zeros(q.shape[0], dtype=torch.int64), k.shape[1],
        )  # fmt: skip
        return get_backend("reference", "cpu").forward(q, k, v, md, softmax_scale)

    fake = types.ModuleType("flash_attn")
    fake.flash_attn_varlen_func = flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    from cbbench.kernels.flash_attn_backend import FlashAttnBackend

    batch = make_batch(*batch_shapes("mixed", 256), 256, 4, torch.float16)
    # drop cu_seqlens_k: the backend must derive it from seq_lens
    batch.metadata = dataclasses.replace(batch.metadata, cu_seqlens_k=None)
    scale = HEAD_DIM**-0.5
    out = FlashAttnBackend().forward(
        batch.query, batch.k_cache, batch.v_cache, batch.metadata, scale
    )
    assert calls == [True]
    assert_close(out, dense_attention(batch, scale), torch.float16)
    with pytest.raises(ValueError, match="fp16 and bf16"):
        FlashAttnBackend().forward(
            batch.query.float(), batch.k_cache.float(), batch.v_cache.float(), batch.metadata, scale
        )


# ---------------------------------------------------------------------------------------------
# CUDA: compiled Triton, flash-attn


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("gqa", GQA_RATIOS)
@pytest.mark.parametrize("case", CASES)
def test_triton_cuda(case: str, gqa: int, block_size: int, dtype: torch.dtype) -> None:
    pytest.importorskip("triton")
    batch = make_batch(*batch_shapes(case, block_size), block_size, gqa, dtype, device="cuda")
    scale = HEAD_DIM**-0.5
    assert_close(run_backend("triton", batch, scale), run_backend("reference", batch, scale), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_cuda_llama_shapes(dtype: torch.dtype) -> None:
    """Llama-like heads (32 q / 8 kv, dim 128) and longer rows, so the compiled tiles are full."""
    pytest.importorskip("triton")
    query_lens, context_lens = [1] * 6 + [300, 77], [700, 0, 15, 255, 1000, 31, 0, 400]
    batch = make_batch(
        query_lens, context_lens, 16, 4, dtype, device="cuda", head_dim=128, num_kv_heads=8
    )
    scale = 128**-0.5
    assert_close(run_backend("triton", batch, scale), run_backend("reference", batch, scale), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["torch", "triton"])
def test_write_kv_cuda(name: str, dtype: torch.dtype) -> None:
    if name == "triton":
        pytest.importorskip("triton")
    check_write_kv(name, "cuda", dtype)


@pytest.mark.cuda
def test_auto_on_cuda() -> None:
    name = get_backend("auto", "cuda", block_size=16).name
    assert name == ("triton" if "triton" in available_backends("cuda") else "torch")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gqa", GQA_RATIOS)
@pytest.mark.parametrize("case", CASES)
def test_flash_attn_cuda(case: str, gqa: int, dtype: torch.dtype) -> None:
    pytest.importorskip("flash_attn")
    block_size = 256  # flash-attn's paged mode needs a multiple of 256
    batch = make_batch(*batch_shapes(case, block_size), block_size, gqa, dtype, device="cuda")
    scale = HEAD_DIM**-0.5
    assert_close(
        run_backend("flash-attn", batch, scale), run_backend("reference", batch, scale), dtype
    )
    assert get_backend("auto", "cuda", block_size=block_size).name == "flash-attn"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attn_write_kv_cuda(dtype: torch.dtype) -> None:
    pytest.importorskip("flash_attn")
    check_write_kv("flash-attn", "cuda", dtype, block_size=256)
