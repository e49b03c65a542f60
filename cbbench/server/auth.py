"""`cbbench serve --api-key`: every request needs ``Authorization: Bearer KEY`` (or, as Anthropic's
clients send it, ``x-api-key: KEY``) except the public endpoints (health, metrics, the API
docs), as vLLM guards its routes. A missing or wrong key is a 401 in the endpoint's error format
(OpenAI's; Anthropic's ``authentication_error`` on /v1/messages); the answer never repeats what
the client sent.

The key is kept only as its SHA-256 digest and compared in constant time (no timing hint of how
much of a guess matched). Nothing here logs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import secrets

from cbbench.errors import UsageError
from cbbench.server.protocol import APIError, send_json

PUBLIC_PATHS = frozenset({"/health", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc",
                          "/openapi.json"})
ENV_PREFIX = "env:"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BEARER = "bearer"
UNAUTHORIZED = 401
MISSING_KEY = (
    "missing API key: send it as the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')"
)
WRONG_KEY = "incorrect API key provided"
LOOPBACK_NAMES = frozenset({"localhost"})


def resolve_api_key(value: str | None) -> str | None:
    """The key from ``--api-key``: the value itself, or ``env:NAME`` read from the environment
    (so the key need not appear on the command line or in the process list)."""
    if value is None:
        return None
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX):]
        if not ENV_NAME_RE.match(name):
            raise UsageError(f"--api-key env:{name}: not an environment variable name")
        value = os.environ.get(name)
        if value is None:
            raise UsageError(f"--api-key: the environment variable {name} is not set")
        if not value:
            raise UsageError(f"--api-key: the environment variable {name} is empty")
    elif not value:
        raise UsageError("--api-key: the key is empty")
    if any(c.isspace() for c in value) or not value.isprintable():
        raise UsageError("--api-key: the key may not contain spaces or control characters")
    return value


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _digest(text: bytes) -> bytes:
    return hashlib.sha256(text).digest()


class ApiKeyGuard:
    """Checks the bearer key of an ASGI request before anything reads its body."""

    def __init__(self, api_key: str) -> None:
        self._digest = _digest(api_key.encode())

    def verdict(self, scope) -> str | None:
        """None when the request may pass, else the 401's message."""
        if scope.get("method") == "OPTIONS" or scope["path"] in PUBLIC_PATHS:
            return None
        auth = key = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                auth = v
            elif k == b"x-api-key":
                key = v
        if auth is not None:
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != BEARER.encode() or not token:
                return MISSING_KEY
        elif key:
            token = key
        else:
            return MISSING_KEY
        if not secrets.compare_digest(_digest(token.strip()), self._digest):
            return WRONG_KEY
        return None

    @staticmethod
    async def reject(send, message: str, api=None) -> None:
        """The 401, in the error shape of ``api`` (a generation endpoint's; None: OpenAI's)."""
        err = APIError(UNAUTHORIZED, message, code="invalid_api_key")
        await send_json(send, UNAUTHORIZED, api.error_body(err) if api is not None else err.body(),
                        [(b"www-authenticate", b"Bearer")])
