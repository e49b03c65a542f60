"""What every endpoint of `cbbench serve` shares: the configuration, the engine bridge, the
metrics and request log, and what the ready engine serves (model name, codec, vocabulary)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cbbench.engine.core.request import SamplingParams
from cbbench.load.chat_template import ChatTemplate
from cbbench.server.apis.response_store import ResponseStore
from cbbench.server.async_engine import AsyncEngine
from cbbench.server.chat_render import ChatRenderer
from cbbench.server.limits import (
    DEFAULT_LIMIT_IMAGES_PER_PROMPT,
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_STORED_BYTES,
)
from cbbench.server.prometheus import ServerMetrics
from cbbench.server.protocol import APIError
from cbbench.server.request_log import RequestLog, RequestTrace
from cbbench.server.stream_events import DEFAULT_REASONING_FIELD
from cbbench.server.text import TextCodec, make_codec, placeholder_reply_ids

# A request body may hold this many bytes per token of the context (JSON token ids take under
# 8, text around 4-6, escaped non-ASCII text up to ~20), and at least MIN_BODY_BYTES: anything
# longer cannot fit the context anyway, and buffering it let clients fill the server's memory.
BODY_BYTES_PER_TOKEN = 64
MIN_BODY_BYTES = 1 << 20


@dataclass
class ServeConfig:
    served_model_name: str | None = None  # None: the engine's model name
    tokenizer: object | None = None  # a tokenizers.Tokenizer, or None for the fallback
    # The tokenizer folder's chat template (load_chat_template), rendered around chats as vLLM
    # renders the model's; None: the minimal template (chat_render.py).
    chat_template: ChatTemplate | None = None
    # Sampling for fields a request leaves out (the command line's --temperature, ...).
    defaults: SamplingParams = field(default_factory=SamplingParams)
    request_log: str | None = None  # --request-log: a JSON-lines file, appended to
    api_key: str | None = field(default=None, repr=False)  # --api-key, resolved; never shown
    # --stream-interval (vLLM's): a stream event is written once this many tokens are waiting
    # (or the request ends); 1: every engine step's tokens at once.
    stream_interval: int = 1
    reasoning_field: str = DEFAULT_REASONING_FIELD  # --reasoning-field
    # usage.prompt_tokens_details.cached_tokens on every answer: on with prefix caching.
    report_cached_tokens: bool = False
    # --enable-per-request-metrics (vLLM's): the engine's timings as `metrics` in each answer.
    per_request_metrics: bool = False
    # --max-image-bytes: the encoded image bytes one chat request may carry (413 beyond).
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    # --limit-mm-per-prompt: the images one chat request may carry (400 beyond, before any
    # image is read).
    limit_images_per_prompt: int = DEFAULT_LIMIT_IMAGES_PER_PROMPT
    # --max-stored-response-bytes: the Responses API's stored conversations, in bytes.
    max_stored_response_bytes: int = DEFAULT_MAX_STORED_BYTES


@dataclass(frozen=True)
class Served:
    """What the ready engine serves."""

    name: str
    codec: TextCodec
    vocab_size: int  # 0: unknown (no id check)
    max_model_len: int | None
    created: int
    kv_capacity_tokens: int | None = None  # the KV pool's tokens
    chat: ChatRenderer = field(default_factory=ChatRenderer)  # how chats become prompts
    # The engine samples no ids (the simulator): with a tokenizer its replies are scripted
    # (text.py placeholder_reply_ids), so the prefix cache holds them as a real engine's.
    scripts_replies: bool = False

    def reply_ids(self, max_tokens: int) -> list[int] | None:
        """The scripted ids of a reply of ``max_tokens`` tokens; None: the engine's own."""
        return placeholder_reply_ids(self.codec, max_tokens) if self.scripts_replies else None

    def output_room(self, prompt_tokens: int) -> int | None:
        """vLLM's output limit for a chat or Responses request that sets none (get_max_tokens):
        the context left after the prompt. Within what the KV pool holds too: vLLM refuses at
        start-up a context its pool cannot hold, this server serves one (a default beyond the
        pool would make every such request a 400). At least 1: a prompt that fills the
        context is refused with the context's reason. None: the context is unknown."""
        limits = [n for n in (self.max_model_len, self.kv_capacity_tokens) if n]
        return max(1, min(limits) - prompt_tokens) if limits else None


class ServeContext:
    def __init__(self, cfg: ServeConfig, bridge: AsyncEngine, metrics: ServerMetrics) -> None:
        self.cfg = cfg
        self.bridge = bridge
        self.metrics = metrics
        self.request_log = RequestLog(cfg.request_log) if cfg.request_log else None
        self._served: Served | None = None  # set once, when the engine is first seen ready
        # /v1/responses' stored responses (previous_response_id), within a byte budget.
        self.responses = ResponseStore(max_bytes=cfg.max_stored_response_bytes)

    def ready(self) -> Served:
        """What the engine serves, or a 503 while it starts (or after it failed)."""
        if self._served is not None:
            return self._served
        bridge = self.bridge
        if not bridge.ready:
            msg = bridge.error or "the engine is starting"
            raise APIError(503, msg, type="server_error", code="engine_not_ready")
        info = bridge.info or {}
        vocab = info.get("vocab_size") or info.get("model_config", {}).get("vocab_size") or 0
        self._served = Served(
            name=self.cfg.served_model_name or str(info.get("model", "model")),
            codec=make_codec(self.cfg.tokenizer, vocab),
            vocab_size=vocab,
            max_model_len=info.get("max_model_len"),
            created=int(time.time()),
            kv_capacity_tokens=info.get("kv_capacity_tokens"),
            chat=ChatRenderer(self.cfg.chat_template),
            scripts_replies=info.get("engine") == "sim",
        )
        return self._served

    def max_body_bytes(self, images: bool = False) -> int:
        """The largest request body accepted (413 beyond it); ``images``: a body that may
        carry images (chat) may be larger by their base64 (4/3 of --max-image-bytes)."""
        s = self._served
        context = s.max_model_len if s is not None and s.max_model_len else 0
        text = max(MIN_BODY_BYTES, context * BODY_BYTES_PER_TOKEN)
        return text + (self.cfg.max_image_bytes * 4 // 3 if images else 0)

    @staticmethod
    def check_model(s: Served, model: str | None) -> None:
        if model is not None and model != s.name:
            raise APIError(
                404, f"the model {model!r} does not exist; this server serves {s.name!r}",
                param="model", code="model_not_found",
            )

    def sampling(self, body) -> SamplingParams:
        """A request's sampling, the server's defaults filling the fields it left out."""
        d = self.cfg.defaults
        top_k = body.top_k if body.top_k is not None else d.top_k
        return SamplingParams(
            temperature=body.temperature if body.temperature is not None else d.temperature,
            top_p=body.top_p if body.top_p is not None else d.top_p,
            top_k=max(top_k, 0),
            seed=body.seed,
            ignore_eos=body.ignore_eos if body.ignore_eos is not None else d.ignore_eos,
            stop_token_ids=frozenset(getattr(body, "stop_token_ids", None) or ()),
        )

    def log(self, trace: RequestTrace) -> None:
        if self.request_log is not None:
            self.request_log.write(trace)
