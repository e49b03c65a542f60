"""What a run against an OpenAI-compatible endpoint is told: the endpoint (normalized, and
redacted for the result file), the API, request headers (values from the environment, never
written out), timeouts, the concurrency cap and the tokenizer."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from cbbench.errors import UsageError

APIS = ("completions", "chat", "responses", "anthropic", "embeddings", "rerank")
API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
             "responses": "/v1/responses", "anthropic": "/v1/messages",
             "embeddings": "/v1/embeddings", "rerank": "/v1/rerank"}
# Non-streaming APIs whose requests carry inputs and no output (targets/apis/pooling_request.py).
POOLING_APIS = ("embeddings", "rerank")
MAX_BATCH_SIZE = 2048  # OpenAI's limit on the inputs of one embeddings request
# RFC 9110 token characters: what a header name may hold.
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_header(text: str) -> tuple[str, str]:
    """'KEY=VALUE' -> (KEY, VALUE). A VALUE of '$NAME' or 'env:NAME' is read from the
    environment, so secrets need not appear on the command line."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(
            f"invalid --header {key or text!r}: use KEY=VALUE, e.g. --header "
            "Authorization=env:AUTH_HEADER (reads the value from $AUTH_HEADER)"
        )
    if not HEADER_NAME_RE.match(key):
        raise UsageError(f"invalid --header name {key!r}: letters, digits and -_. only")
    env_name = (
        value[1:] if value.startswith("$") else value[4:] if value.startswith("env:") else None
    )
    if env_name is not None:
        if not ENV_NAME_RE.match(env_name):
            raise UsageError(f"--header {key}: {env_name!r} is not an environment variable name")
        if env_name not in os.environ:
            raise UsageError(f"--header {key}: environment variable {env_name} is not set")
        value = os.environ[env_name]
    if "\r" in value or "\n" in value:
        raise UsageError(f"--header {key}: the value may not contain line breaks")
    return key, value


def normalize_endpoint(url: str) -> str:
    """The server's base URL: 'http://host:8000', '.../v1' and a trailing '/' all mean the
    same server; request paths (/v1/completions, /metrics) are added to it."""
    usage = "use http(s)://HOST[:PORT], PORT in [1, 65535]"
    if any(c.isspace() or not c.isprintable() for c in url.strip()):
        # urlsplit drops CR, LF and tabs silently: '/v1\r\nX: y' went out as '/v1X:%20y'.
        raise UsageError(f"invalid --endpoint {redact_url(url)!r}: it holds a space or a "
                         "control character (percent-encode it)")
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # urlsplit checks the port only when asked: 99999, '80a'
    except ValueError as e:  # an unclosed IPv6 bracket, a port out of range
        raise UsageError(f"invalid --endpoint {redact_url(url)!r} ({e}): {usage}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise UsageError(f"invalid --endpoint {redact_url(url)!r}: {usage}")
    if parts.query or parts.fragment:
        raise UsageError("--endpoint takes no query string: give the server's base URL")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def redact_url(url: str) -> str:
    """The URL without user:password@ and query (which may carry credentials)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:  # not parseable: drop what may be credentials by hand
        return re.sub(r"//[^/?#]*@", "//", url.strip()).split("?")[0].split("#")[0]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass
class EndpointOptions:
    endpoint: str
    api: str = "completions"  # or one of APIS
    served_model: str | None = None  # None: the first model of GET /v1/models
    ignore_eos_field: bool = True  # send vLLM/SGLang's `ignore_eos: true`
    headers: dict[str, str] = field(default_factory=dict)
    request_timeout_s: float = 600.0  # the whole request, send to last event
    max_concurrency: int | None = None
    tokenizer: str | None = None  # a tokenizer.json (a folder's, resolved): exact prompts, counts
    scrape_metrics: bool = False
    scrape_metrics_filter: str | None = None  # a regex over metric names; None: known servers
    seed: int = 0  # synthetic prompt text; the run's seed
    # --batch-size: embeddings inputs (rerank: documents) per request; None: 1
    batch_size: int | None = None
    balance: str = "round-robin"  # several endpoints: targets/balance.py
    lora_modules: dict[str, float] | None = None  # adapter name -> share of the requests

    @property
    def pooling(self) -> bool:
        return self.api in POOLING_APIS

    def endpoints(self) -> list[str]:
        """The base URL of each comma-separated --endpoint, normalized."""
        return [normalize_endpoint(u) for u in self.endpoint.split(",")]

    def validate(self) -> None:
        urls = self.endpoints()
        if len(set(urls)) < len(urls):
            raise UsageError("--endpoint names one URL twice: give each replica once")
        if len(urls) > 1 and (self.scrape_metrics or self.scrape_metrics_filter is not None):
            raise UsageError("--scrape-metrics reads one server's /metrics: give one --endpoint")
        if self.api not in APIS:
            raise UsageError(f"unknown --api {self.api!r}: use {', '.join(APIS)}")
        if self.batch_size is not None:
            if not self.pooling:
                raise UsageError("--batch-size applies to --api embeddings and rerank (inputs "
                                 "per request)")
            if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
                raise UsageError(f"--batch-size must be in [1, {MAX_BATCH_SIZE}], got "
                                 f"{self.batch_size}")
        t = self.request_timeout_s
        if not (t > 0 and math.isfinite(t)):
            raise UsageError(f"--request-timeout must be a positive number of seconds, got {t}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.scrape_metrics_filter is not None:
            try:
                re.compile(self.scrape_metrics_filter)
            except re.error as e:
                raise UsageError(
                    f"invalid --scrape-metrics-filter {self.scrape_metrics_filter!r}: {e}"
                ) from None
        for key, value in self.headers.items():
            try:
                value.encode("latin-1")  # what HTTP/1.1 header bytes can carry
            except UnicodeEncodeError:
                raise UsageError(f"--header {key}: the value must be ASCII/Latin-1 text") from None

    def to_config(self, served_model: str | None = None) -> dict:
        """For the result file: header *names* only (values may be API keys), and the
        endpoint without credentials. ``served_model``: the model the run resolved to."""
        urls = [redact_url(u) for u in self.endpoint.split(",")]
        return {
            "endpoint": ",".join(urls),
            **({"endpoints": urls, "balance": self.balance} if len(urls) > 1 else {}),
            **({"lora_modules": self.lora_modules} if self.lora_modules else {}),
            "api": self.api,
            "served_model": served_model or self.served_model,
            "served_model_requested": self.served_model,
            "ignore_eos_field": self.ignore_eos_field,
            "header_names": sorted(self.headers),
            "request_timeout_s": self.request_timeout_s,
            "max_concurrency": self.max_concurrency,
            "tokenizer": self.tokenizer,
            "scrape_metrics": self.scrape_metrics,
            "scrape_metrics_filter": self.scrape_metrics_filter,
            **({"batch_size": self.batch_size or 1} if self.pooling else {}),
        }
