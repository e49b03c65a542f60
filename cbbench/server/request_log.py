"""`cbbench serve --request-log FILE`: one JSON line per generation request, on the server's
wall clock (epoch seconds, rounded to the microsecond).

Every request that passed validation and was handed to the engine gets a line when it ends
(requests refused before that, with a 400 or 401, get none):

- ``id``: the id the client sees in the response (``cmpl-...``, ``chatcmpl-...``, ``resp_...``,
  ``msg_...``; a client's ``X-Request-Id`` header becomes its tail, as in vLLM); ``engine_id``:
  the engine's number; ``api``: completions | chat | responses | anthropic; ``stream``.
- ``arrival``: the request reached the app (headers parsed, before the body was read);
  ``submitted``: handed to the engine after parsing, validation and tokenization (the arrival
  the engine and the ``vllm:*`` latency metrics count from); ``admitted``: the engine thread
  took it into the scheduler's queue (where ``vllm:request_queue_time_seconds`` starts, as
  vLLM's QUEUED event); ``queue_exit``: first scheduled.
- ``first_token`` / ``last_token``: when the engine produced them; ``first_token_sent`` /
  ``last_token_sent``: when the HTTP layer handed their bytes to the ASGI server's ``send``
  (a non-streaming response: the whole body, both), stamped before that call is awaited: never
  later than the client's receipt (server/sent_stamp.py; stamped after the await, the engine
  thread holding the GIL made it up to ~6 ms late).
- ``first_output`` / ``first_output_sent``: the first answer or tool-call token (not
  reasoning), made and sent: the server's side of TTFOT;
- ``events`` (streamed requests): every stream event as ``[write time, tokens, kind]`` (the
  write time stamped as ``*_sent``), kind
  ``reasoning`` | ``answer`` | ``tool`` (or ``reasoning+answer`` ... for an event that
  straddles a boundary): the truth ``cbbench audit`` holds a client's per-token figures to;
- ``prompt_tokens``, ``output_tokens``, ``reasoning_tokens``, ``tool_call_tokens``,
  ``cached_tokens`` (prompt tokens the prefix cache served), ``preemptions``; ``finish``: length | stop |
  tool_calls (every API: the request made a tool call) | abort (the
  client went away) | rejected (the engine could never fit it) | error (the engine failed);
  ``status``: the HTTP status; ``error``: the reason, for rejected and error.
- ``images``, ``image_bytes``, ``image_tokens``: a chat request's images (count, encoded bytes,
  prompt tokens they cost: part of ``prompt_tokens``); null without images.
- ``api`` embeddings | rerank (server/apis/pooling.py): ``inputs`` the inputs (rerank: query-document
  pairs) of the request, ``prompt_tokens`` all their tokens, ``first_token``/``last_token`` when
  the first and the last input's prefill finished, ``output_tokens`` 0.

Timestamps not reached are null. Times are taken on ``time.perf_counter()`` and moved to the
epoch by one offset measured at start, so differences between fields are exact.

Writing costs the event loop one queue put per request: a thread formats and writes the lines,
and flushes whenever it has caught up, so a line is on disk soon after its request ends. Lines
are appended; a run that is killed keeps every line written before.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path

from cbbench.clock_offset import perf_minus_epoch

log = logging.getLogger("cbbench.server")

EPOCH_DECIMALS = 6  # microseconds
STOP_JOIN_TIMEOUT_S = 10.0

TIME_FIELDS = (
    "arrival", "submitted", "admitted", "queue_exit", "first_token", "first_token_sent",
    "first_output", "first_output_sent", "last_token", "last_token_sent",
)


class RequestTrace:
    """One request's way through the server, filled in on the event loop (perf_counter times)."""

    __slots__ = (
        "id", "engine_id", "api", "stream", *TIME_FIELDS, "prompt_tokens", "output_tokens",
        "reasoning_tokens", "tool_call_tokens", "cached_tokens", "preemptions", "finish",
        "status", "error", "events", "images", "image_bytes", "image_tokens", "inputs",
    )

    def __init__(self, id: str, api: str, stream: bool, arrival: float) -> None:
        self.id = id
        self.engine_id: int | None = None
        self.api = api
        self.stream = stream
        self.arrival = arrival
        self.submitted: float | None = None
        self.admitted: float | None = None
        self.queue_exit: float | None = None
        self.first_token: float | None = None
        self.first_token_sent: float | None = None
        self.first_output: float | None = None  # the first answer or tool token (not reasoning)
        self.first_output_sent: float | None = None
        self.last_token: float | None = None
        self.last_token_sent: float | None = None
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.reasoning_tokens = 0
        self.tool_call_tokens = 0
        self.cached_tokens: int | None = None
        self.preemptions = 0
        self.finish: str | None = None
        self.status: int | None = None
        self.error: str | None = None
        # Streamed: every event as (write time, tokens, kind) -- the truth a client's per-token
        # figures are audited against (cbbench audit).
        self.events: list[tuple[float, int, str]] | None = None
        # Chat requests with images (server/images.py): how many, their encoded bytes, and the
        # prompt tokens they cost (part of prompt_tokens). None: a request without images.
        self.images: int | None = None
        self.image_bytes: int | None = None
        self.image_tokens: int | None = None
        # Embeddings and rerank: the inputs (or query-document pairs) the request carried.
        self.inputs: int | None = None

    def to_dict(self, epoch_offset: float) -> dict:
        d = {}
        for name in self.__slots__:
            v = getattr(self, name)
            if name in TIME_FIELDS and v is not None:
                v = round(v + epoch_offset, EPOCH_DECIMALS)
            elif name == "events" and v is not None:
                v = [[round(t + epoch_offset, EPOCH_DECIMALS), k, kind] for t, k, kind in v]
            d[name] = v
        return d


class RequestLog:
    """Appends traces to a JSON-lines file from a writer thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # Opened here, so that a bad path fails at start-up, not at the first request.
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        # Bracketed reads, not two back to back (a preemption between them shifts every time).
        self.epoch_offset = -perf_minus_epoch()
        self._queue: queue.SimpleQueue[RequestTrace | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="cbbench-request-log", daemon=True)
        self._thread.start()

    def write(self, trace: RequestTrace) -> None:
        """Queue a finished request's trace (the caller no longer changes it)."""
        if not self._closed:
            self._queue.put(trace)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(STOP_JOIN_TIMEOUT_S)

    def _run(self) -> None:
        f, q, offset = self._file, self._queue, self.epoch_offset
        try:
            while (trace := q.get()) is not None:
                f.write(json.dumps(trace.to_dict(offset), separators=(",", ":")) + "\n")
                if q.empty():
                    f.flush()
        except OSError as e:
            # A full disk: say so once and stop logging (the server serves on). Unhandled, it
            # ended this thread with a traceback and every later trace queued up for ever.
            self._closed = True
            log.warning("request log %s: cannot write (%s); request logging stopped",
                        self.path, e.strerror or e)
            while not q.empty():
                q.get_nowait()
        finally:
            try:
                f.close()
            except OSError:
                pass
