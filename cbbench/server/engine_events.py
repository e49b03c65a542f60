"""What the engine thread hands the server: the events on a request's queue, the engine's
snapshot, and each step's statistics for the metrics (the bridge is in async_engine.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cbbench.engine.core.request import Request


# Times are monotonic seconds on time.perf_counter()'s scale (CLOCK_MONOTONIC on Linux, shared by
# every process on the host), so a client on the same machine can compare them with its own.
@dataclass(frozen=True, slots=True)
class Admitted:
    """The first event of every stream: accepted (error None) or rejected with the reason.
    ``time_s``: when the engine thread took the request from the inbox (its admission)."""

    error: str | None
    time_s: float


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """The tokens one engine step gave a request: one, or several when the step emitted more
    than one for it (speculative decoding's accepted drafts plus the bonus token). The server
    writes them as one stream event, as vLLM does."""

    token_ids: tuple[int | None, ...]  # None: the simulator models no token ids
    time_s: float  # when the engine produced them (the step's end)
    finish_reason: str | None  # "length" | "stop" on the request's last token, else None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine stopped (shutdown or an internal error) before the request finished
    (status 503), or failed this request's batch and goes on serving (status 500)."""

    message: str
    status: int = 503


StreamEvent = Admitted | TokenEvent | Failed


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    ready: bool
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    num_steps: int = 0
    error: str | None = None

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


@dataclass(frozen=True, slots=True)
class FinishedStats:
    """One finished request's intervals, as vLLM's finished-request stats define them
    (seconds): e2e from arrival, queue from the scheduler taking it in (vLLM's QUEUED event;
    the arrival is earlier by the wait for the step in flight) to first scheduled, prefill
    from first scheduled to first token, decode from first to last token, inference from
    first scheduled to last token, and the request's mean time per output token after the
    first."""

    finish_reason: str
    e2e_s: float
    queue_s: float
    prefill_s: float
    decode_s: float
    inference_s: float
    mean_tpot_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int


@dataclass(slots=True)
class StepStats:
    """What one engine step produced, for the metrics (built in the engine thread).
    Latencies count from a request's arrival: when the server handed it to the engine."""

    new_tokens: int = 0
    prompt_tokens: int = 0  # prompts of the requests that got their first token
    ttfts_s: list[float] = field(default_factory=list)
    itls_s: list[float] = field(default_factory=list)  # one per request's output after its first
    finished: list[FinishedStats] = field(default_factory=list)


class EngineObserver(Protocol):
    """Called from the engine thread (metrics); must be quick and thread-safe."""

    def on_ready(self, info: dict) -> None: ...
    def on_admitted(self, req: Request) -> None: ...
    def on_rejected(self, req: Request) -> None: ...
    def on_aborted(self, req: Request) -> None: ...
    def on_failed(self, req: Request) -> None: ...  # the engine failed it and serves on
    def on_step(self, out, stats: StepStats) -> None: ...
