"""The model runner on a CUDA GPU: bf16, the compiled Triton backend, and decode CUDA graphs.

Skipped without a GPU (see conftest.py). The engine's bookkeeping is played by hand, as in
test_model_runner.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from graph_standins import syncing_graph_body

from cbbench.engine.core.request import Request
from cbbench.engine.core.scheduler_output import SchedulerOutput
from cbbench.engine.torch.kv_sizing import cuda_num_kv_blocks, kv_block_bytes, startup_free_bytes
from cbbench.engine.torch.model_runner import ModelRunner
from cbbench.engine.torch.models import allocate_kv_cache, load_model
from cbbench.kernels import get_backend

pytestmark = pytest.mark.cuda

DEVICE = "cuda"
BLOCK_SIZE = 16
NUM_BLOCKS = 256
PROMPT_LENS = (5, 17, 33, 40, 64)


def _backend(name: str = "triton"):
    try:
        return get_backend(name, DEVICE, block_size=BLOCK_SIZE)
    except RuntimeError as exc:
        pytest.skip(str(exc))


def _model(preset: str, dtype: torch.dtype, backend: str = "triton"):
    return load_model(preset, dtype, DEVICE, _backend(backend), seed=0, max_model_len=1024)


def _runner(model, config, dtype, graphs: bool, max_num_seqs: int = 8) -> ModelRunner:
    kv_caches = allocate_kv_cache(config, NUM_BLOCKS, BLOCK_SIZE, dtype, DEVICE)
    return ModelRunner(
        model,
        config,
        kv_caches,
        BLOCK_SIZE,
        DEVICE,
        dtype,
        use_cuda_graphs=graphs,
        max_num_seqs=max_num_seqs,
    )


def _requests(vocab: int, offset: int) -> list[Request]:
    """Requests with disjoint block ranges starting at ``offset`` (64 blocks each)."""
    reqs = []
    g = torch.Generator().manual_seed(0)
    for i, n in enumerate(PROMPT_LENS):
        req = Request(
            i, n, 32, prompt_token_ids=torch.randint(0, vocab, (n,), generator=g).tolist()
        )
        req.block_table = list(range(offset + 40 * i, offset + 40 * (i + 1)))
        reqs.append(req)
    return reqs


def _sched(work: list[tuple[Request, int]]) -> SchedulerOutput:
    num_decode = sum(1 for r, n in work if n == 1 and r.num_computed_tokens >= r.num_prompt_tokens)
    counts = [n for _, n in work]
    return SchedulerOutput(
        [r for r, _ in work], counts, num_decode, sum(counts[num_decode:]), sum(counts)
    )


def _advance(work, tokens) -> None:
    for (req, n), token in zip(work, tokens, strict=True):
        req.num_computed_tokens += n
        if token is not None:
            req.output_token_ids.append(token)
            req.num_output_tokens += 1


def _prefill_then_decode(backend: str, dtype, tokens: list[int] | None):
    """Logits of a packed prefill of PROMPT_LENS, then of one decode step fed ``tokens`` (the
    reference's, so one bf16 argmax flip cannot derail the comparison); and the tokens."""
    model, config = _model("small", dtype, backend)
    runner = _runner(model, config, dtype, graphs=False)
    runner.warmup()
    reqs = _requests(config.vocab_size, offset=0)
    work = [(r, r.num_prompt_tokens) for r in reqs]
    prefill = runner.compute_logits(runner.prepare(_sched(work)))
    sampled = runner.execute(_sched(work)).sampled_token_ids
    assert all(isinstance(t, int) for t in sampled)
    tokens = sampled if tokens is None else tokens
    _advance(work, tokens)
    decode = runner.compute_logits(runner.prepare(_sched([(r, 1) for r in reqs])))
    assert torch.isfinite(decode).all()
    return (prefill, decode), tokens


@pytest.mark.parametrize("backend", ["triton", "torch", "flash-attn"])
def test_bf16_backend_matches_reference_backend(backend):
    """Every backend against the reference on the GPU in bf16, the torch backend included."""
    dtype = torch.bfloat16
    _backend(backend)  # skips when it cannot run here
    ref, tokens = _prefill_then_decode("reference", dtype, None)
    got, _ = _prefill_then_decode(backend, dtype, tokens)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == torch.float32
        assert torch.allclose(g, r, atol=2e-2, rtol=2e-2), (g - r).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_graph_replay_matches_eager(dtype):
    model, config = _model("tiny", dtype)
    eager = _runner(model, config, dtype, graphs=False)
    graphed = _runner(model, config, dtype, graphs=True)
    graphed.warmup()
    assert sorted(graphed.graphs.graphs) == [1, 2, 4, 8]
    req_sets = [_requests(config.vocab_size, offset=0), _requests(config.vocab_size, offset=0)]

    def step(pick) -> list[torch.Tensor]:
        out = []
        works = [[(r, n) for r, n in pick(reqs)] for reqs in req_sets]
        for runner, work in zip((eager, graphed), works, strict=True):
            out.append(runner.compute_logits(runner.prepare(_sched(work))))
        tokens = out[0].argmax(-1).tolist()  # both follow eager's tokens, so they stay in step
        for work in works:
            it = iter(tokens)
            _advance(
                work,
                [next(it) if r.num_computed_tokens + n == r.num_tokens else None for r, n in work],
            )
        return out

    assert graphed.mixed_graphs_effective, graphed.mixed_graphs_fallback_reason
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    # Piecewise graphs: prefill of the first three (5 + 17 + 33 = 55 tokens -> 64) ...
    got_eager, got_graph = step(lambda reqs: [(r, r.num_prompt_tokens) for r in reqs[:3]])
    assert torch.allclose(got_graph, got_eager, atol=tol, rtol=tol)
    # ... then a mixed step: their decodes with the other two prompts (3 + 40 + 64 = 107 -> 128).
    got_eager, got_graph = step(
        lambda reqs: [(r, 1) for r in reqs[:3]] + [(r, r.num_prompt_tokens) for r in reqs[3:]]
    )
    assert torch.allclose(got_graph, got_eager, atol=tol, rtol=tol)
    # 5 rows (padded to 8), then 3 (padded to 4: rows left over from the 5 must not leak), then 1.
    for pick in (
        lambda reqs: [(r, 1) for r in reqs],
        lambda reqs: [(r, 1) for r in reqs[1:4]],
        lambda reqs: [(r, 1) for r in reqs[4:]],
        lambda reqs: [(r, 1) for r in reqs],
    ):
        got_eager, got_graph = step(pick)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.allclose(got_graph, got_eager, atol=tol, rtol=tol)


def test_graph_runner_execute_samples_tokens():
    model, config = _model("tiny", torch.bfloat16)
    runner = _runner(model, config, torch.bfloat16, graphs=True, max_num_seqs=4)
    reqs = _requests(config.vocab_size, offset=0)[:4]
    work = [(r, r.num_prompt_tokens) for r in reqs]
    _advance(work, runner.execute(_sched(work)).sampled_token_ids)
    for _ in range(3):
        work = [(r, 1) for r in reqs]
        tokens = runner.execute(_sched(work)).sampled_token_ids
        assert all(isinstance(t, int) and 0 <= t < config.vocab_size for t in tokens)
        _advance(work, tokens)
    assert all(r.num_output_tokens == 4 for r in reqs)


def test_cuda_kv_block_count_fits_in_free_memory():
    free_at_start = startup_free_bytes(0.5)
    model, config = _model("tiny", torch.bfloat16)
    blocks = cuda_num_kv_blocks(config, BLOCK_SIZE, torch.bfloat16, 0.5, free_at_start)
    free, total = torch.cuda.mem_get_info()
    assert 0 < blocks * kv_block_bytes(config, BLOCK_SIZE, torch.bfloat16) <= 0.5 * total


def test_graph_capture_error_falls_back_to_eager(monkeypatch, notices):
    """A body that syncs with the host cannot be captured: the capture really fails (its reason
    names the capture error, not a TypeError from a stand-in with the wrong signature), the
    caller's stream is current again (engine/cuda_graphs.py's cleanup), and the runner decodes
    eagerly with the tokens an eager runner gives."""
    model, config = _model("tiny", torch.bfloat16)
    syncs = []

    def sync() -> None:
        syncs.append(torch.cuda.is_current_stream_capturing())
        torch.cuda.current_stream().synchronize()  # illegal while capturing

    body = syncing_graph_body(ModelRunner._graph_body, sync)
    monkeypatch.setattr(ModelRunner, "_graph_body", body)
    default_stream = torch.cuda.current_stream()
    runner = ModelRunner(
        model, config, allocate_kv_cache(config, NUM_BLOCKS, BLOCK_SIZE, torch.bfloat16, DEVICE),
        BLOCK_SIZE, DEVICE, torch.bfloat16, use_cuda_graphs=True, max_num_seqs=4,
    )  # fmt: skip
    monkeypatch.undo()
    # The warm-up runs (not capturing) synced fine; the first capture's sync is what failed.
    assert syncs[-1] is True and not any(syncs[:-1]), syncs
    reason = runner.graphs_fallback_reason
    assert not runner.cuda_graphs_effective and reason
    assert "TypeError" not in reason and re.search(r"captur", reason, re.IGNORECASE), reason
    assert len(notices) == 1 and "\n" not in notices[0] and reason in notices[0]
    assert torch.cuda.current_stream() == default_stream
    assert not torch.cuda.is_current_stream_capturing()
    assert runner.graphs.padded_size(4) is None and runner.graphs.pool is None  # decodes eagerly
    eager = _runner(model, config, torch.bfloat16, graphs=False, max_num_seqs=4)
    outs = []
    for r in (runner, eager):
        reqs = _requests(config.vocab_size, offset=0)[:4]
        work = [(q, q.num_prompt_tokens) for q in reqs]
        _advance(work, r.execute(_sched(work)).sampled_token_ids)
        for _ in range(3):
            work = [(q, 1) for q in reqs]
            _advance(work, r.execute(_sched(work)).sampled_token_ids)
        outs.append([q.output_token_ids for q in reqs])
    assert outs[0] == outs[1]


def test_no_triton_compilation_after_warmup():
    """Issue 12 item 4: after warm-up, a run mixing prefill, decode and mixed iterations at
    varying batch sizes compiles no Triton kernel (each compile would stall an iteration)."""
    from cbbench.engine.args import EngineArgs
    from cbbench.engine.build import build_engine
    from cbbench.engine.core.feed import run_until_done

    args = EngineArgs(engine="torch", device="cuda", model="tiny", max_num_seqs=16,
                      max_num_batched_tokens=64, num_kv_blocks=512)  # fmt: skip
    engine, info = build_engine(args)
    if engine.executor.kernel_compilations_since_ready() is None:
        pytest.skip("Triton's compilation hook is not available")
    g = torch.Generator().manual_seed(1)
    reqs = [
        Request(i, n, m, arrival_time=0.0,
                prompt_token_ids=torch.randint(0, 512, (n,), generator=g).tolist())
        for i, (n, m) in enumerate([(5, 9), (70, 3), (17, 30), (1, 12), (40, 7), (130, 5)] * 3)
    ]  # fmt: skip
    assert run_until_done(engine, reqs)
    assert engine.executor.kernel_compilations_since_ready() == 0
