"""The torch model runner (packed batches over a paged cache) and the sampler, on the CPU in fp32.

The tests play the engine's part by hand: a tiny block allocator fills each request's block
table, and after every ``execute`` the request's ``num_computed_tokens`` is advanced and the
sampled token appended.
"""

from __future__ import annotations

import pytest
import torch
from runner_harness import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    VOCAB,
    Harness,
    _advance,
    make_request,
)

from cbbench.engine.core.clock import WallClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.feed import run_until_done
from cbbench.engine.core.request import Request, SamplingParams
from cbbench.engine.core.scheduler import SchedulerConfig
from cbbench.engine.core.scheduler_output import SchedulerOutput
from cbbench.engine.torch import model_runner
from cbbench.engine.torch.cuda_graphs import GraphLadder
from cbbench.engine.torch.models import load_model
from cbbench.engine.torch.piecewise import ForwardPieces
from cbbench.engine.torch.sampler import Sampler, SamplingBatch
from cbbench.kernels import get_backend

TOL = 1e-4














def _alone_logits(token_ids: list[int], backend: str = "reference") -> torch.Tensor:
    """Every row's logits for one request prefilled alone in a fresh cache."""
    h = Harness(backend)
    req = Request(999, len(token_ids), 1, prompt_token_ids=token_ids)
    return h.all_row_logits(h.schedule([(req, len(token_ids))]))


def _mixed_batch(h: Harness):
    """Two decodes with cached context, a chunk over a cached chunk, and a fresh prefill."""
    a, b, c, d = make_request(0, 10), make_request(1, 7), make_request(2, 20), make_request(3, 9)
    assert h.step([(a, 10)]) != [None]  # a: prefill, then one decode
    assert h.step([(b, 7)]) != [None]
    h.step([(a, 1)])
    assert h.step([(c, 8)]) == [None]  # c: first chunk of its prompt
    work = [(a, 1), (b, 1), (c, 7), (d, 9)]
    return (a, b, c, d), work


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_mixed_batch_matches_each_request_alone(backend):
    h = Harness(backend)
    reqs, work = _mixed_batch(h)
    sched = h.schedule(work)
    assert sched.num_decode_reqs == 2
    packed = h.all_row_logits(sched)
    start = 0
    for req, n in work:
        end_tok = req.num_computed_tokens + n
        alone = _alone_logits(req.token_ids_slice(0, end_tok))[-n:]
        diff = (packed[start : start + n] - alone).abs().max().item()
        assert diff < TOL, f"request {req.request_id}: max diff {diff}"
        start += n

    # The runner samples exactly the rows that complete a request: greedy = argmax.
    logits = h.runner.compute_logits(h.runner.prepare(sched))
    ends = [1, 2, 2 + 7 + 9]  # last rows of a, b and d (c's chunk is partial)
    assert torch.allclose(logits, packed[[e - 1 for e in ends]], atol=TOL)
    sampled = h.runner.execute(sched).sampled_token_ids
    a, b, c, d = reqs
    expected = packed[[e - 1 for e in ends]].argmax(-1).tolist()
    assert sampled == [expected[0], expected[1], None, expected[2]]

    _advance(sched, sampled)
    assert h.step([(c, 5)]) != [None]  # the completing chunk samples a token
    assert c.num_output_tokens == 1


def test_torch_and_reference_backends_agree_in_the_runner():
    logits = []
    for backend in ("reference", "torch"):
        h = Harness(backend)
        _, work = _mixed_batch(h)
        logits.append(h.all_row_logits(h.schedule(work)))
        # and a pure-decode iteration afterwards
        reqs = [r for r, _ in work]
        sched = h.schedule(work)
        _advance(sched, h.runner.execute(sched).sampled_token_ids)
        decodes = [(r, 1) for r in reqs if r.num_computed_tokens == r.num_tokens - 1]
        logits.append(h.runner.compute_logits(h.runner.prepare(h.schedule(decodes))))
    assert (logits[0] - logits[2]).abs().max().item() < TOL
    assert logits[1].shape[0] == 3  # a, b, d decode; c is mid-prompt
    assert (logits[1] - logits[3]).abs().max().item() < TOL


def test_batch_layout():
    h = Harness()
    _, work = _mixed_batch(h)
    batch = h.runner.prepare(h.schedule(work))
    md = batch.metadata
    assert md.cu_seqlens_q.tolist() == [0, 1, 2, 9, 18]
    assert md.seq_lens.tolist() == [12, 8, 15, 9]
    assert (md.max_seqlen_q, md.max_seqlen_k) == (9, 15)
    assert batch.positions.tolist() == [11, 7, *range(8, 15), *range(9)]
    assert md.block_tables.dtype == torch.int32 and md.block_tables.shape == (4, 4)
    for i, (req, _) in enumerate(work):  # every slot lands in the request's own block table
        rows = range(md.cu_seqlens_q[i], md.cu_seqlens_q[i + 1])
        for row in rows:
            pos = int(batch.positions[row])
            slot = int(md.slot_mapping[row])
            assert slot == req.block_table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
    assert batch.logits_indices.tolist() == [0, 1, 17]
    assert batch.sample_req_indices == [0, 1, 3]


class _EagerGraph:
    """Stands in for a captured CUDA graph on the CPU: replay runs the captured body eagerly
    on the runner's static buffers, so the padding and buffer logic is what gets tested."""

    def __init__(self, run) -> None:
        self.run, self.replays = run, 0

    def replay(self) -> None:
        self.run()
        self.replays += 1

    def pool(self):
        return None


class EagerGraphLadder(GraphLadder):
    """A GraphLadder whose 'graphs' replay eagerly; a capture fails where ``fail`` says so
    (called with the ladder's piece count)."""

    fail = staticmethod(lambda pieces: False)

    def capture_stream(self):
        return None

    def synchronize(self) -> None:
        pass

    def capture_one(self, run, stream, pool):
        if type(self).fail(self.pieces):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\n"
                               "(a second line)")  # fmt: skip
        run()  # the warm-up run
        return _EagerGraph(run)


@pytest.fixture
def eager_graphs(monkeypatch):
    monkeypatch.setattr(model_runner, "GraphLadder", EagerGraphLadder)
    monkeypatch.setattr(EagerGraphLadder, "fail", staticmethod(lambda pieces: False))
    return EagerGraphLadder


def _fail_decode_capture(ladder_cls) -> None:
    """The decode ladder's 3rd capture raises (the 1-piece ladder); mixed captures succeed."""
    calls = []

    def fail(pieces):
        calls.append(pieces)
        return pieces == 1 and len(calls) == 3

    ladder_cls.fail = staticmethod(fail)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_decode_graph_replay_logic_matches_eager(backend, eager_graphs):
    eager = Harness(backend)
    graphed = Harness(backend, max_num_seqs=8, use_cuda_graphs=True)
    runner = graphed.runner
    assert runner.graph_batch_sizes() == [1, 2, 4, 8]
    assert runner.cuda_graphs_effective and runner.graphs_fallback_reason is None
    graphs = {bs: pieces[0] for bs, pieces in runner.graphs.graphs.items()}
    for g in graphs.values():
        g.replays = 0
    reqs = {h: [make_request(i, n) for i, n in enumerate((5, 9, 13, 4, 21))] for h in (eager, graphed)}

    def step(pick) -> None:
        scheds = {h: h.schedule(pick(reqs[h])) for h in (eager, graphed)}
        logits = {h: h.runner.compute_logits(h.runner.prepare(s)) for h, s in scheds.items()}
        assert (logits[graphed] - logits[eager]).abs().max().item() < TOL
        tokens = logits[eager].argmax(-1).tolist()
        for sched in scheds.values():
            _advance(sched, tokens)

    step(lambda rs: [(r, r.num_prompt_tokens) for r in rs])  # prefill: piecewise, not decode
    assert not any(g.replays for g in graphs.values())
    # 5 rows pad to 8; then 3 pad to 4 (leftovers of the 5 must not leak); 1; 5 again.
    for pick in (
        lambda rs: [(r, 1) for r in rs],
        lambda rs: [(r, 1) for r in rs[1:4]],
        lambda rs: [(r, 1) for r in rs[4:]],
        lambda rs: [(r, 1) for r in rs],
    ):
        step(pick)
    assert {bs: g.replays for bs, g in graphs.items()} == {1: 1, 2: 0, 4: 1, 8: 2}


def test_a_decode_graph_replay_uploads_no_cu_seqlens_q(eager_graphs, monkeypatch):
    """Issue 39 item 2: a decode graph reads its own constant cu_seqlens_q (0, 1, 2, ...), so a
    replay step copies no cu_seqlens_q to the device (one host-to-device copy per step less,
    UNTESTED for its time on a GPU); eager and mixed steps still upload theirs."""
    graphed = Harness("torch", max_num_seqs=8, use_cuda_graphs=True)
    runner = graphed.runner
    uploaded: list[str] = []
    real_upload = runner.inputs.upload

    def upload(name, *args, **kwargs):
        uploaded.append(name)
        return real_upload(name, *args, **kwargs)

    monkeypatch.setattr(runner.inputs, "upload", upload)
    reqs = [make_request(i, n) for i, n in enumerate((5, 9, 13))]
    graphed.step([(r, r.num_prompt_tokens) for r in reqs])  # prefill: mixed, not a decode graph
    assert "cu_seqlens_q" in uploaded
    uploaded.clear()
    batch = runner.prepare(graphed.schedule([(r, 1) for r in reqs]))
    assert batch.graph_size == 4
    assert "cu_seqlens_q" not in uploaded and {"input_ids", "seq_lens"} <= set(uploaded)
    assert batch.metadata.cu_seqlens_q.tolist() == [0, 1, 2, 3]


def test_failed_graph_capture_falls_back_to_eager_and_the_run_completes(eager_graphs, notices):
    """A capture error (simulated: a decode capture raises) drops every decode graph, keeps a
    one-line reason, logs it, and the engine then serves every request (decodes
    through the piecewise graphs) with the same tokens as a runner that never tried graphs."""
    _fail_decode_capture(eager_graphs)
    outputs = {}
    for graphs in (False, True):
        h = Harness(max_num_seqs=8, use_cuda_graphs=graphs)
        if graphs:
            assert not h.runner.cuda_graphs_effective
            reason = h.runner.graphs_fallback_reason
            assert "operation not permitted" in reason and "\n" not in reason
            assert notices == [f"CUDA graph capture failed, decoding eagerly: {reason}"]
            assert h.runner.mixed_graphs_effective
        engine = Engine(
            EngineConfig(SchedulerConfig(max_model_len=128, max_num_seqs=8), NUM_BLOCKS,
                         BLOCK_SIZE), h.runner, WallClock()
        )  # fmt: skip
        reqs = [make_request(i, n) for i, n in enumerate((5, 9, 13, 4, 21))]
        assert run_until_done(engine, reqs)
        assert all(r.num_output_tokens == r.max_tokens for r in reqs)
        outputs[graphs] = [r.output_token_ids for r in reqs]
    assert outputs[True] == outputs[False]


@pytest.mark.parametrize("fused", [False, True])
def test_forward_pieces_equal_the_model_forward(fused):
    """The forward cut at attention (piecewise graphs' pieces), run eagerly, computes what the
    model's own forward computes, for a mixed batch (fused: the Triton ops, interpreted)."""
    h = Harness("torch")
    if fused:
        attn = get_backend("torch", "cpu")
        h.model, _ = load_model("tiny", torch.float32, "cpu", attn, seed=0, fused=True)
        h.runner.model = h.model
    _, work = _mixed_batch(h)
    batch = h.runner.prepare(h.schedule(work))
    md = batch.metadata
    with torch.inference_mode():
        want = h.model(batch.input_ids, batch.positions, h.kv_caches, md)
        pieces = ForwardPieces(h.model, md.num_tokens, torch.float32, "cpu")
        got = pieces.forward(
            lambda i: pieces.run_piece(i, batch.input_ids, batch.positions, md.slot_mapping,
                                       h.kv_caches),
            h.kv_caches, md,
        )  # fmt: skip
    assert pieces.num_pieces == h.config.num_layers + 1
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-6), (got - want).abs().max().item()


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_mixed_piecewise_graph_replay_matches_eager(backend, eager_graphs):
    """Mixed and prefill iterations replay the pieces padded to the next token size (padding
    tokens store no KV and must not disturb the real rows); decodes replay decode graphs."""
    eager = Harness(backend)
    graphed = Harness(backend, max_num_seqs=8, use_cuda_graphs=True)
    runner = graphed.runner
    assert runner.mixed_graphs_effective and runner.piecewise_token_sizes()[:3] == [8, 16, 24]
    pieces = runner.mixed_graphs.graphs
    assert all(len(p) == graphed.config.num_layers + 1 for p in pieces.values())
    for graphs in pieces.values():
        for g in graphs:
            g.replays = 0
    logits = {}
    for h in (eager, graphed):
        _, work = _mixed_batch(h)  # prefills of 10 and 7 tokens, a decode, a chunk of 8
        sched = h.schedule(work)  # 2 decodes + a 7-token chunk + a 9-token prompt: 18 tokens
        logits[h] = h.runner.compute_logits(h.runner.prepare(sched))
    assert (logits[graphed] - logits[eager]).abs().max().item() < TOL
    replayed = {size: graphs[0].replays for size, graphs in pieces.items() if graphs[0].replays}
    # _mixed_batch's steps: 10 tokens -> 16, 7 -> 8, then a pure decode (a decode graph),
    # 8 -> 8; the mixed step's 18 tokens -> 24.
    assert replayed == {16: 1, 8: 2, 24: 1}
    assert all(g.replays == graphs[0].replays for graphs in pieces.values() for g in graphs)


def test_failed_mixed_capture_runs_mixed_iterations_eagerly(eager_graphs, notices):
    eager_graphs.fail = staticmethod(lambda pieces: pieces > 1)
    h = Harness(max_num_seqs=8, use_cuda_graphs=True)
    assert h.runner.cuda_graphs_effective and not h.runner.mixed_graphs_effective
    assert "operation not permitted" in h.runner.mixed_graphs_fallback_reason
    assert len(notices) == 1 and "mixed iterations" in notices[0]
    _, work = _mixed_batch(h)
    assert h.step(work)[0] is not None


def test_short_block_table_is_a_clear_error():
    h = Harness()
    req = make_request(0, 10)
    req.block_table = [0, 1]  # 8 tokens' worth
    sched = SchedulerOutput([req], [10], 0, 10, 10)
    with pytest.raises(ValueError, match="block table has 2 blocks"):
        h.runner.execute(sched)


# ---- sampler --------------------------------------------------------------------------------


def _logits(rows: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits(6)
    reqs = [make_request(i, 4) for i in range(6)]
    assert torch.equal(Sampler()(logits, reqs), logits.argmax(-1))


def test_seeded_sampling_is_reproducible_and_batch_independent():
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=7)
    reqs = [make_request(i, 4, params) for i in range(8)]
    logits = _logits(8)
    sampler = Sampler()
    first = sampler(logits, reqs)
    assert torch.equal(first, sampler(logits, reqs))
    # Alone, or in a shuffled batch with a greedy neighbour, each request draws the same token.
    for i in range(8):
        assert sampler(logits[i : i + 1], reqs[i : i + 1]).item() == first[i].item()
    order = [5, 2, 7, 0]
    greedy_neighbour = make_request(99, 4)
    mixed = sampler(
        torch.cat([logits[order], logits[:1]]), [reqs[i] for i in order] + [greedy_neighbour]
    )
    assert mixed[:4].tolist() == first[order].tolist()
    assert mixed[4].item() == logits[0].argmax().item()
    # A different seed gives different draws.
    other = [
        make_request(i, 4, SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=8))
        for i in range(8)
    ]
    assert not torch.equal(first, sampler(logits, other))


def test_top_k_and_top_p_restrict_the_support():
    logits = _logits(1)[0]
    top5 = set(logits.topk(5).indices.tolist())
    sampler = Sampler()
    batch = SamplingBatch([1.0] * 200, [5] * 200, [1.0] * 200, list(range(200)))
    drawn = sampler.sample(logits.expand(200, -1).clone(), batch).tolist()
    assert set(drawn) <= top5 and len(set(drawn)) > 1
    # Rows with and without top-k in one batch: only the top-k rows are restricted.
    batch = SamplingBatch([1.0] * 200, [5, 0] * 100, [1.0] * 200, list(range(200)))
    drawn = sampler.sample(logits.expand(200, -1).clone(), batch).tolist()
    assert set(drawn[::2]) <= top5 and not set(drawn[1::2]) <= top5
    # top_p so small only the most likely token survives; top_k=1 likewise.
    for k, p in ((0, 1e-6), (1, 1.0)):
        batch = SamplingBatch([1.0] * 20, [k] * 20, [p] * 20, list(range(20)))
        drawn = sampler.sample(logits.expand(20, -1).clone(), batch)
        assert (drawn == logits.argmax()).all()


def test_sampling_follows_the_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    n = 4000
    batch = SamplingBatch([1.0] * n, [0] * n, [1.0] * n, list(range(n)))
    drawn = Sampler().sample(logits.expand(n, -1).clone(), batch)
    freq = torch.bincount(drawn, minlength=4).float() / n
    assert (freq - torch.softmax(logits[0], -1)).abs().max().item() < 0.03


def test_kv_blocks_for_memory_follows_the_design_rule():
    from cbbench.engine.model_config import MODEL_PRESETS
    from cbbench.engine.torch.kv_sizing import num_kv_blocks_for_memory

    config = MODEL_PRESETS["llama-3-8b"]
    assert config.kv_bytes_per_token("bf16") == 131_072
    memory = 80 * 10**9
    expected = (memory - config.weight_bytes("bf16")) // 131_072 // 16
    assert num_kv_blocks_for_memory(config, 16, torch.bfloat16, memory) == expected
    assert num_kv_blocks_for_memory(config, 16, "bf16", memory) == expected
    assert num_kv_blocks_for_memory(config, 16, "bf16", 10**9) == 0  # weights alone overflow



def test_cuda_kv_blocks_follow_vllm_v1s_budget_not_other_processes(monkeypatch):
    """vLLM V1 (gpu_worker.py): free memory at start below utilization x total refuses to
    start; otherwise the KV gets utilization x total less what this process took (weights),
    not less what other processes hold. A faked torch.cuda.mem_get_info stands for an 80 GiB
    GPU with 4 GiB held by another process (under the 8 GiB that 0.9 leaves), then 12 GiB."""
    from cbbench.engine.model_config import MODEL_PRESETS
    from cbbench.engine.torch.kv_sizing import GiB, cuda_num_kv_blocks, startup_free_bytes

    config, total = MODEL_PRESETS["llama-3-8b"], 80 * GiB
    readings = iter([(total - 4 * GiB, total), (total - 4 * GiB - 15 * GiB, total)])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: next(readings))
    free_at_start = startup_free_bytes(0.9)
    blocks = cuda_num_kv_blocks(config, 16, "bf16", 0.9, free_at_start)
    # 72 GiB budget - 15 GiB taken by the load - 2 GiB reserve = 55 GiB of 2 MiB blocks.
    assert blocks == 55 * 512
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - 12 * GiB, total))
    with pytest.raises(ValueError, match=r"free memory on the device \(68.00/80.00 GiB\)"):
        startup_free_bytes(0.9)

def test_failed_capture_is_recorded_in_the_result_and_the_run_completes(eager_graphs, monkeypatch,
                                                                        notices):
    """Through cbbench's own run path: graphs asked for and captured (stand-ins) on the CPU,
    a decode capture fails, the run serves every request, and the result's config says
    cuda_graphs_effective: false with the one-line reason."""
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine import build_torch
    from cbbench.engine.args import EngineArgs

    _fail_decode_capture(eager_graphs)
    monkeypatch.setattr(build_torch, "_graphs_plan", lambda args, on_cuda, backend: (True, None))
    spec = run_spec(
        workload="sharegpt", num_requests=6, engine=EngineArgs(engine="torch", model="tiny",
                                                                max_num_seqs=8),
    )  # fmt: skip
    result = execute_run(spec)
    config = result.config
    assert config.cuda_graphs is True and config.cuda_graphs_effective is False
    assert config.cuda_graphs_reason.startswith("capture failed: RuntimeError: CUDA error")
    assert config.cuda_graphs_mixed_effective is True  # the piecewise captures succeeded
    assert "\n" not in config.cuda_graphs_reason
    assert any(n.startswith("CUDA graph capture failed, decoding eagerly") for n in notices)
    assert result.summary.completed == 6 and result.summary.failed == 0


def test_fused_kernels_switch(monkeypatch):
    """--fused-kernels: auto is off on the CPU; on runs the Triton layer kernels where Triton
    can run (here: its interpreter, which conftest turns on) and is a one-line error where not."""
    from cbbench.engine import build
    from cbbench.engine.args import EngineArgs, EngineArgsError

    # A 16-token context: the build's warm-up passes (a prefill of max_model_len tokens, a
    # decode over max_model_len keys, a mixed batch) run the fused kernels interpreted.
    base = dict(engine="torch", model="tiny", attention_backend="torch", max_model_len=16)
    _, info = build.build_engine(EngineArgs(**base))
    assert info.fused_kernels is False
    engine, info = build.build_engine(EngineArgs(**base, fused_kernels="on"))
    assert info.fused_kernels is True and engine.executor.model.ops.fused
    monkeypatch.setattr("cbbench.kernels.available_backends", lambda device: ["reference", "torch"])
    with pytest.raises(EngineArgsError, match="--fused-kernels on: the Triton kernels cannot run"):
        build.build_engine(EngineArgs(**base, fused_kernels="on"))
