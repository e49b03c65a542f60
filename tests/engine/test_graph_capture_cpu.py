"""CUDA graph capture failures, on the CPU (issue 29 items 2 and 3).

1. The CUDA capture-failure test's stand-in body (tests/engine/graph_standins.py) is called the way
   ``GraphLadder.capture`` calls a body, through the real ModelRunner capture path: a stand-in
   whose signature drifted would die with a TypeError before any capture (the old bug), and
   this test would say so.
2. ``torch.cuda.graph``'s ``__exit__`` calls ``capture_end`` before leaving its stream context;
   when ``capture_end`` raises, ``GraphLadder.capture_one`` must still make the caller's stream
   current again and reset the graph (its memory pool). The real ``torch.cuda.graph`` class
   runs here, with the CUDA calls under it (streams, the graph object) standing in on the CPU.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from graph_standins import syncing_graph_body

from cbbench.engine.torch import model_runner
from cbbench.engine.torch.cuda_graphs import GraphLadder
from cbbench.engine.torch.model_runner import ModelRunner
from cbbench.engine.torch.models import allocate_kv_cache, load_model
from cbbench.kernels import get_backend

BLOCK_SIZE = 4
CAPTURE_ERROR = "CUDA error: operation failed due to a previous error during capture"


# ---- 1. the stand-in's signature, through the real call site ---------------------------------


class CpuLadder(GraphLadder):
    """Captures nothing: runs the body once per size, as the warm-up would."""

    def capture_stream(self):
        return None

    def synchronize(self) -> None:
        pass

    def capture_one(self, run, stream, pool):
        run()
        return _NoGraph()


class _NoGraph:
    def pool(self):
        return None

    def replay(self) -> None:
        raise AssertionError("not replayed in this test")


def _runner(monkeypatch, body) -> ModelRunner:
    model, config = load_model("tiny", torch.float32, "cpu", get_backend("torch", "cpu"), seed=0)
    monkeypatch.setattr(model_runner, "GraphLadder", CpuLadder)
    monkeypatch.setattr(ModelRunner, "_graph_body", body)
    kv = allocate_kv_cache(config, 16, BLOCK_SIZE, torch.float32, "cpu")
    return ModelRunner(model, config, kv, BLOCK_SIZE, "cpu", torch.float32, use_cuda_graphs=True,
                       max_num_seqs=4)  # fmt: skip


def test_the_cuda_tests_stand_in_body_is_called_as_the_ladder_calls_it(monkeypatch):
    syncs = []
    body = syncing_graph_body(ModelRunner._graph_body, lambda: syncs.append(1))
    runner = _runner(monkeypatch, body)
    assert runner.graphs_fallback_reason is None, runner.graphs_fallback_reason
    assert sorted(runner.graphs.graphs) == [1, 2, 4]
    assert len(syncs) == 3  # the real body ran and then the sync, once per size
    # And the signature binds what GraphLadder.capture passes: body(size, piece).
    inspect.signature(body).bind(runner, 4, 0)


def test_a_stand_in_with_the_old_signature_is_caught(monkeypatch):
    """The control: the issue's broken stand-in (self, bs) fails with a TypeError through the
    same path, so the test above can fail."""

    def old_body(self, bs):
        pass

    runner = _runner(monkeypatch, old_body)
    assert runner.graphs_fallback_reason.startswith("TypeError")


# ---- 2. a raising capture_end leaves the current stream as it was -----------------------------


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.device = torch.device("cuda", 0)

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeStreams:
    """The current-stream state torch.cuda keeps, and torch.cuda.stream's context manager
    (torch's StreamContext is a no-op without a CUDA device, so it stands in too)."""

    def __init__(self) -> None:
        self.default = FakeStream("default")
        self.current = self.default

    def current_stream(self, device=None):
        return self.current

    def set_stream(self, stream) -> None:
        self.current = stream

    def stream(self, stream):
        streams = self

        class Context:
            def __enter__(self):
                self.prev = streams.current
                streams.current = stream

            def __exit__(self, *exc):
                streams.current = self.prev

        return Context()


class FakeGraph:
    """capture_end raises, as a CUDA graph whose capture was invalidated does."""

    made: list = []

    def __init__(self) -> None:
        self.reset_calls = 0
        self.began = False
        FakeGraph.made.append(self)

    def capture_begin(self, *pool, **kwargs) -> None:
        self.began = True

    def capture_end(self) -> None:
        raise RuntimeError(CAPTURE_ERROR)

    def pool(self):
        return ("pool", id(self))

    def reset(self) -> None:
        self.reset_calls += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    streams = FakeStreams()
    FakeGraph.made = []
    monkeypatch.setattr(torch.cuda, "current_stream", streams.current_stream)
    monkeypatch.setattr(torch.cuda, "set_stream", streams.set_stream)
    monkeypatch.setattr(torch.cuda, "stream", streams.stream)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("capture"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    # A CPU build of torch lacks it; torch.cuda.graph's __enter__ calls it.
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: None, raising=False)
    return streams


def test_bare_torch_cuda_graph_leaves_the_capture_stream_current(fake_cuda):
    """The premise, with the real torch.cuda.graph: capture_end raising in __exit__ skips the
    stream context's exit, so the capture stream stays current."""
    capture = FakeStream("capture")
    with (
        pytest.raises(RuntimeError, match="previous error during capture"),
        torch.cuda.graph(FakeGraph(), stream=capture),
    ):
        pass
    assert fake_cuda.current is capture


@pytest.mark.parametrize("body_raises", [False, True])
def test_a_raising_capture_end_leaves_the_current_stream_as_it_was(fake_cuda, body_raises):
    """capture_end raises (after a clean body, or after a body whose own error invalidated the
    capture): the caller's stream is current again, every graph was reset (its pool dropped),
    the ladder holds nothing, and the reason names the first error first."""
    runs = []

    def body(size, piece):
        capturing = fake_cuda.current is not fake_cuda.default
        runs.append((size, capturing))
        if body_raises and FakeGraph.made and FakeGraph.made[-1].began:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    ladder = GraphLadder([1, 2], torch.device("cuda", 0))
    reason = ladder.capture(body)
    assert fake_cuda.current is fake_cuda.default
    assert reason is not None and "previous error during capture" in reason
    if body_raises:
        assert reason.startswith("RuntimeError: CUDA error: operation not permitted"), reason
    assert not ladder and ladder.pool is None and ladder.padded_size(1) is None
    assert len(FakeGraph.made) == 1 and FakeGraph.made[0].reset_calls >= 1
    # The capture ran on the capture stream (warm-ups and the capture itself) of the largest size.
    assert runs and all(size == 2 and capturing for size, capturing in runs)
