"""What one generation API of `cbbench serve` adds to the shared generation core (generate.py):
how it reads a request (``Api.parse``: the body -> a Job), how it shapes the answer
(``Api.shaper``: a StreamShaper per request, for the events of a stream or the one JSON body of a
non-streaming answer), and its error format (``Api.error_body``).

The core does everything else once for every API: it hands the prompt to the engine, groups each
engine step's tokens into one stream write (or --stream-interval tokens), decodes them, splits
them into reasoning / answer / tool-call runs (stream_events.OutputPlan), writes the bytes the
shaper makes, logs every write's time and token count in the request log, and aborts the request
when the client goes away. So a new API is a small module: OpenAI's completions and chat
(chat_api.py), the Responses API (responses_api.py), Anthropic's Messages (anthropic_api.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cbbench.engine.core.request import SamplingParams
from cbbench.server.protocol import APIError
from cbbench.server.stream_events import OutputPlan

if TYPE_CHECKING:
    from cbbench.server.context import ServeConfig, ServeContext, Served
    from cbbench.server.images import ImageCost


@dataclass(frozen=True, slots=True)
class Job:
    """One generation request, validated and encoded. ``request``: the API's validated request
    model (a shaper echoes some of its fields, as the Responses API does)."""

    api: Api
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stream: bool
    include_usage: bool = False
    return_token_times: bool = False
    continuous_usage: bool = False
    plan: OutputPlan = OutputPlan()
    request: object = None
    per_request_metrics: bool = False  # --enable-per-request-metrics (request_metrics.py)
    images: tuple[ImageCost, ...] = ()  # chat image parts (server/images.py)


@dataclass(frozen=True, slots=True)
class Counts:
    """A finished request's token counts, for the usage block of its API."""

    prompt_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_tokens: int | None  # prompt tokens the prefix cache served (None: not known)
    report_cached: bool  # the server reports cached tokens (--enable-prefix-caching)
    reasoned: bool  # the request asked for reasoning tokens
    image_tokens: int | None = None  # prompt tokens its images cost (server/images.py)
    # --enable-per-request-metrics: vLLM's `metrics` object (request_metrics.py); None: off
    metrics: dict | None = None


@dataclass(frozen=True, slots=True)
class OutputTexts:
    """A non-streamed answer's text by kind; ``tool`` None: no token was a tool call's."""

    reasoning: str
    answer: str
    tool: str | None


class StreamShaper(Protocol):
    """One request's answer in its API's shape. ``pieces`` are one event's (kind, text) runs in
    order (kind: stream_events.REASONING | ANSWER | TOOL); ``n``: the output tokens so far,
    these included; ``last``: the request ends with them. A stream is ``opening()`` (written
    when the response starts), ``started(cached_tokens)`` (written before the first tokens:
    the engine has scheduled the request, so its prefix-cache hits are known), ``tokens``
    per event, then ``closing`` (or ``failure``)."""

    id: str  # the id the client sees (and the request log's)
    times: list[float] | None  # the engine's token times, when the answer carries them

    def opening(self) -> bytes: ...
    def started(self, cached_tokens: int | None) -> bytes: ...
    def tokens(self, pieces: list[list[str]], n: int, last: bool,
               engine_finish: str | None) -> bytes: ...
    def closing(self, counts: Counts, engine_finish: str) -> bytes: ...
    def failure(self, message: str) -> bytes: ...
    def finish_reason(self, engine_finish: str | None) -> str | None: ...
    def full(self, texts: OutputTexts, counts: Counts, engine_finish: str) -> dict: ...


class Api(Protocol):
    name: str  # the request log's ``api``

    def parse(self, body: bytes, ctx: ServeContext) -> tuple[Served, Job]: ...
    def shaper(self, job: Job, s: Served, client_request_id: str | None,
               cfg: ServeConfig, submitted_s: float) -> StreamShaper: ...
    def error_body(self, e: APIError) -> dict: ...
