"""The serve options: how `cbbench serve` listens and answers (the engine options come from
EngineArgs)."""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.errors import UsageError
from cbbench.options.fields import check_fields, opt
from cbbench.server.limits import (
    DEFAULT_LIMIT_IMAGES_PER_PROMPT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_STORED_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    parse_image_limit,
)
from cbbench.server.stream_events import REASONING_FIELDS

MAX_PORT = 65535
MAX_READ_TIMEOUT_S = 24 * 3600.0
MAX_STREAM_INTERVAL = 1 << 16


@dataclass(frozen=True)
class ServeOptions:
    host: str = opt("127.0.0.1", "Address to listen on.")
    port: int = opt(8000, "Port to listen on (0: any free port).", low=0, high=MAX_PORT)
    served_model_name: str | None = opt(
        None, "Model name clients use. Default: the --model name."
    )
    tokenizer: str | None = opt(
        None,
        "tokenizer.json (or its folder) to encode prompts and decode outputs; the chat_template "
        "of the tokenizer_config.json beside it renders chats, as vLLM renders them (none: a "
        "minimal template). Without --tokenizer, each prompt word is one token and outputs are "
        "placeholder text (' tok' per token for sim, each token id as text for torch).",
    )
    seed: int = opt(0, "Engine seed (random-weight model presets).")
    api_key: str | None = opt(
        None,
        "Require 'Authorization: Bearer KEY' on every endpoint but /health and /metrics. "
        "env:NAME reads the key from $NAME (keeps it off the command line).",
    )
    request_log: str | None = opt(
        None,
        "Append one JSON line per request to this file: id, arrival, queue exit, first and last "
        "token (made and sent), token counts, preemptions and how it ended, in epoch seconds.",
    )
    read_timeout: float = opt(
        DEFAULT_READ_TIMEOUT_S,
        "Seconds a client has to send a whole request (head and body) from its first byte; "
        "slower ones get 408 and are disconnected. The answer itself may take as long as it "
        "takes.",
        low=0.0, low_open=True, high=MAX_READ_TIMEOUT_S,
    )
    max_connections: int = opt(
        DEFAULT_MAX_CONNECTIONS,
        "Open connections served at once; more get a 503 (too_many_connections). Lowered to "
        "what the open-file limit allows.",
        low=1,
    )
    stream_interval: int = opt(
        1,
        "Write a request's first token at once, then a stream event once this many tokens are "
        "waiting (or the request ends), as vLLM's --stream-interval: N > 1 makes multi-token "
        "events. 1: each engine step's tokens for a request as one event.",
        low=1, high=MAX_STREAM_INTERVAL,
    )
    reasoning_field: str = opt(
        "reasoning_content",
        "The delta field reasoning tokens stream in (requests that ask for reasoning_tokens): "
        "reasoning_content, or reasoning as newer vLLM.",
        choices=REASONING_FIELDS, metavar="<str>",
    )

    enable_per_request_metrics: bool = opt(
        False,
        "Return each request's engine timings in its response, as vLLM's flag: `metrics` "
        "(queue_time_ms, time_to_first_token_ms = the prefill, generation_time_ms, "
        "mean_itl_ms, tokens_per_second) on a non-streamed answer and on a stream's final "
        "usage chunk.",
        switch=False,
    )

    max_image_bytes: int = opt(
        DEFAULT_MAX_IMAGE_BYTES,
        "The encoded image bytes one chat request may carry (image_url data: URLs; OpenAI's "
        "50 MB); more is a 413 (request_too_large).",
        low=1,
    )

    max_stored_response_bytes: int = opt(
        DEFAULT_MAX_STORED_BYTES,
        "Memory, in bytes, for the Responses API's stored responses (store: true, as "
        "OpenAI's; previous_response_id continues one): the newest are kept within it (and "
        "the newest 4096 at most); an older one named later is a 400. A count alone bounded "
        "nothing: 4,096 responses of a 0.9 MB input held ~3.6 GB.",
        low=0,
    )
    limit_mm_per_prompt: str = opt(
        f'{{"image": {DEFAULT_LIMIT_IMAGES_PER_PROMPT}}}',
        "The images one chat request may carry, as vLLM's flag ('{\"image\": N}', or N); "
        "more is a 400 before any image is read, so one request cannot hold the server.",
        metavar="<json>",
    )

    @property
    def image_limit(self) -> int:
        return parse_image_limit(self.limit_mm_per_prompt)

    def validate(self) -> None:
        check_fields(self)
        try:
            self.image_limit  # noqa: B018 - parsed here for its error
        except ValueError as e:
            raise UsageError(f"--limit-mm-per-prompt: {e}") from None
