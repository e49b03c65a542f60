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

import torch

CAPTURE_WARMUP_RUNS = 2
MAX_REASON_CHARS = 300


def one_line(exc: BaseException) -> str:
    """An exception as one short line (CUDA errors span many)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
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
        try:
            stream = self.capture_stream()
            for size in reversed(self.sizes):
                graphs = []
                for piece in range(self.pieces):
                    graph = self.capture_one(lambda s=size, p=piece: body(s, p), stream, pool)
                    pool = graph.pool()
                    graphs.append(graph)
                self.graphs[size] = graphs
            self.pool = pool
            self.synchronize()
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            self.graphs.clear()
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
        """Warm up on the capture stream, then capture one graph of ``run`` on it."""
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            for _ in range(CAPTURE_WARMUP_RUNS):
                run()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            run()
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
