"""Connection limits for `cbbench serve`: uvicorn's httptools protocol with a read timeout, a
cap on a request head's size, and a cap on open connections.

uvicorn times out idle keep-alive connections only after a response; a client that connects
and sends half a request (or nothing) was held forever, and a few hundred of them exhausted the
file limit. Here every request must arrive whole (head and body) within the read timeout of
its first byte (of the connection, for the first one): else 408 (while no response started)
and the connection is closed. The read timeout covers reading a request, never the answer: a
long stream is not cut. A head larger than MAX_HEAD_BYTES is refused with 431 (the parser sets
no limit of its own), and a connection beyond the cap gets a 503 in the OpenAI error shape.
"""

from __future__ import annotations

import json

DEFAULT_READ_TIMEOUT_S = 15.0
# OpenAI's documented limit on the image payload of one request (50 MB): --max-image-bytes.
DEFAULT_MAX_IMAGE_BYTES = 50 * 1000 * 1000
# Images one chat request may carry (vLLM's --limit-mm-per-prompt '{"image": N}'). Each image
# costs header parsing on the event loop before the context check: the count bounds that work
# (1,000 68-byte headers in a 163 KB body once blocked the loop for 12 s).
DEFAULT_LIMIT_IMAGES_PER_PROMPT = 64
MAX_LIMIT_IMAGES_PER_PROMPT = 4096
# --max-stored-response-bytes: the Responses API's stored conversations (response_store.py).
DEFAULT_MAX_STORED_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 4096
MAX_HEAD_BYTES = 64 * 1024
# A head's bytes beyond its URL and header names and values: "METHOD ", " HTTP/1.1\r\n" and
# the blank line; ": " and "\r\n" per header (the counts are per request, give or take).
REQUEST_LINE_BYTES = 20
HEADER_LINE_BYTES = 4
# Connections beyond --max-connections being answered 503 at one time; each may take this long
# to send its request before the 503 is written anyway. The open-file limit keeps room for them.
OVERFLOW_RESERVE = 256
OVERFLOW_READ_TIMEOUT_S = 1.0


def parse_image_limit(text: str) -> int:
    """--limit-mm-per-prompt as vLLM takes it (a JSON object, here only its "image" key) or a
    bare count; ValueError (the reason) for anything else."""
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"use a count or a JSON object like '{{\"image\": 16}}', got {text!r}") from None
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"image"})
        if unknown:
            raise ValueError(f"only the image modality is served; unknown key(s) {unknown}")
        value = value.get("image", DEFAULT_LIMIT_IMAGES_PER_PROMPT)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"the image count must be an integer, got {text!r}")
    if not 0 <= value <= MAX_LIMIT_IMAGES_PER_PROMPT:
        raise ValueError(f"the image count must be in [0, {MAX_LIMIT_IMAGES_PER_PROMPT}], got {value}")
    return value


def _raw_response(status: str, message: str, code: str,
                  kind: str = "invalid_request_error") -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind,
                                 "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


REQUEST_TIMEOUT = _raw_response(
    "408 Request Timeout", "the request did not arrive whole within --read-timeout",
    "request_timeout",
)
HEAD_TOO_LARGE = _raw_response(
    "431 Request Header Fields Too Large",
    f"the request head is larger than {MAX_HEAD_BYTES} bytes", "request_head_too_large",
)


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type:
    """An HttpToolsProtocol class with these limits (uvicorn.Config(http=...)). uvicorn is
    imported here, not at the top: every cbbench command imports this module's defaults."""
    from cbbench.server.guarded_http import ConnectionLimits, GuardedHttpToolsProtocol

    message = (f"the server has {max_connections} connections open, its limit "
               "(--max-connections): retry later")
    guard = ConnectionLimits(
        read_timeout_s=read_timeout_s,
        max_connections=max_connections,
        max_head_bytes=MAX_HEAD_BYTES,
        request_line_bytes=REQUEST_LINE_BYTES,
        header_line_bytes=HEADER_LINE_BYTES,
        overflow_reserve=OVERFLOW_RESERVE,
        overflow_read_timeout_s=OVERFLOW_READ_TIMEOUT_S,
        too_many_message=message,
        request_timeout=REQUEST_TIMEOUT,
        head_too_large=HEAD_TOO_LARGE,
        too_many_connections=_raw_response("503 Service Unavailable", message,
                                           "too_many_connections", "server_error"),
    )
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"_guard": guard})
