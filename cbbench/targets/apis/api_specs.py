"""What each `--api` sends and parses, chosen once per run: the path, the fields every request
carries, how one prompt or a session's messages become a body, the default headers, and the
stream parser (sse.py for completions and chat; responses_stream.py, anthropic_stream.py).
Completions and chat keep their own functions (request.py, http_sessions.py), unchanged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cbbench.targets.apis import anthropic_stream, responses_stream
from cbbench.targets.sse import SseStream


def _openai_payload(model: str) -> dict:
    return {
        "model": model,
        "stream": True,
        # continuous_usage_stats: the running usage on every chunk (vLLM, SGLang), so each
        # event's tokens are counted exactly (targets/event_counts.py).
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0,
    }


def _no_headers(user: dict[str, str]) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class ApiSpec:
    name: str
    chat: bool  # prompts are chat text (no token ids); tools are offered
    payload: Callable[[str], dict]
    # (times, keep_text) -> the request's stream parser
    stream: Callable[[list[float], bool], SseStream]
    # (ctx, prompt, max_tokens, extra) -> body; None: request.request_body
    single_body: Callable | None = None
    # (ctx, messages, max_tokens, extra) -> body; None: http_sessions.messages_body (chat)
    messages_body: Callable | None = None
    headers: Callable[[dict[str, str]], dict[str, str]] = _no_headers
    sessions: bool = True  # multi-turn sessions can send their history


SPECS = {
    "completions": ApiSpec("completions", False, _openai_payload,
                           lambda times, keep: SseStream(False, times, keep), sessions=False),
    "chat": ApiSpec("chat", True, _openai_payload, lambda times, keep: SseStream(True, times, keep)),
    "responses": ApiSpec("responses", True, responses_stream.payload,
                         responses_stream.ResponsesStream, responses_stream.single_body,
                         responses_stream.messages_body),
    "anthropic": ApiSpec("anthropic", True, anthropic_stream.payload,
                         anthropic_stream.AnthropicStream, anthropic_stream.single_body,
                         anthropic_stream.messages_body, anthropic_stream.headers),
    # Not streamed: targets/apis/pooling_request.py sends and reads these (its own payload and
    # bodies); the entries give the shared runner its path and headers.
    "embeddings": ApiSpec("embeddings", False, lambda model: {"model": model},
                          lambda times, keep: SseStream(False, times, keep), sessions=False),
    "rerank": ApiSpec("rerank", False, lambda model: {"model": model},
                      lambda times, keep: SseStream(False, times, keep), sessions=False),
}
