"""CUDA graphs for a ladder of padded sizes: capture with a fallback, and replay.

Each size holds ``pieces`` graphs (1 for the decode forward; one per piece of the forward cut
at attention for mixed iterations, see :mod:`.piecewise`), replayed in order by the caller.

Capture follows PyTorch's recipe: each body runs a few times on the capture stream first (so
kernel compilation, the allocator and cuBLAS's per-stream workspace are all set up on the stream
that is then captured), and the graphs share one memory pool, captured largest first so the
smaller ones fit in what the largest made.

A capture that fails (a kernel that syncs with the host, an unsupported op, out of memory) must
not kill a benchmark: every graph captured so far is dropped, the reason is kept as one line,
and the caller runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

CAPTURE_WARMUP_RUNS = 2
MAX_REASON_CHARS = 300


def one_line(exc: BaseException) -> str:
    """An exception as one short line (CUDA errors span many), its first cause first: when a
    body's error invalidates the capture, ``capture_end`` raises again in ``__exit__`` and the
    first error (the one that says why) would otherwise be lost."""
    chain = [exc]
    while chain[-1].__context__ is not None and len(chain) < 4:
        chain.append(chain[-1].__context__)
    text = "; then ".join(" ".join(f"{type(e).__name__}: {e}".split()) for e in reversed(chain))
    return text[:MAX_REASON_CHARS]


class GraphLadder:
    """Graphs keyed by padded size; ``body(size, piece)`` writes its output into the caller's
    static buffers (the graph replays exactly that)."""

    def __init__(self, sizes: list[int], device: torch.device, pieces: int = 1) -> None:
        self.sizes = sorted(sizes)
        self.device = device
        self.pieces = pieces
        self.pool = None
        self.graphs: dict[int, list] = {}  # size -> one graph per piece

    def __bool__(self) -> bool:
        return bool(self.graphs)

    @property
    def max_size(self) -> int:
        return max(self.graphs) if self.graphs else 0

    def padded_size(self, n: int) -> int | None:
        """The smallest captured size holding ``n`` rows, or None."""
        if not self.graphs or n > self.max_size:
            return None
        for size in self.sizes:
            if size >= n and size in self.graphs:
                return size
        return None

    def capture(self, body: Callable[[int, int], None], pool=None) -> str | None:
        """Capture every size (every piece); on failure drop them all and return the reason
        (one line). ``pool``: a memory pool to share (another ladder's)."""
        graphs: list = []
        try:
            stream = self.capture_stream()
            for size in reversed(self.sizes):
                graphs = []
                for piece in range(self.pieces):
                    graph = self.capture_one(partial(body, size, piece), stream, pool)
                    pool = graph.pool()
                    graphs.append(graph)
                self.graphs[size] = graphs
            self.pool = pool
            self.synchronize()
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            for graph in [g for gs in self.graphs.values() for g in gs] + graphs:
                _reset(graph)  # each captured graph holds the shared pool
            self.graphs.clear()
            self.pool = None
            self._recover()
            return one_line(exc)
        return None

    # The CUDA calls, one method each (the CPU tests stand in for them).
    def capture_stream(self):
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device, not {self.device}")
        return torch.cuda.Stream(self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def capture_one(self, run: Callable[[], None], stream, pool):
        """Warm up on the capture stream, then capture one graph of ``run`` on it.

        ``torch.cuda.graph``'s ``__exit__`` calls ``capture_end`` before it leaves its stream
        context, so when ``capture_end`` raises (a body that synced, an op that cannot be
        captured) the capture stream would stay current for every later op and the graph would
        keep its memory pool. Whatever happens, the caller's stream is made current again and a
        failed graph is reset (releasing its pool)."""
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            for _ in range(CAPTURE_WARMUP_RUNS):
                run()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                run()
        except BaseException:
            torch.cuda.set_stream(current)
            _reset(graph)
            raise
        current.wait_stream(stream)
        return graph

    def _recover(self) -> None:
        """Leave the device usable for eager execution after a failed capture."""
        if self.device.type != "cuda":
            return
        try:
            self.synchronize()
            torch.cuda.empty_cache()  # the dropped graphs' pool
        except Exception:  # noqa: BLE001, S110 - a broken context surfaces on the next forward
            pass

    def replay(self, size: int, piece: int = 0) -> None:
        self.graphs[size][piece].replay()


def _reset(graph) -> None:
    """Drop a graph and its reference to the memory pool; a graph broken by a failed capture may
    refuse, and then it is simply garbage."""
    try:
        graph.reset()
    except Exception:  # noqa: BLE001, S110 - nothing more can be done for it
        pass
