"""Per-request measurements, the same for every target (in-process engine or HTTP)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class RequestRecord:
    id: int
    prompt_tokens: int  # intended (from the workload)
    output_tokens: int
    intended_start_s: float  # the arrival schedule, on the run's clock (0 = run start)
    send_s: float | None = None  # when the request was actually sent
    token_times_s: list[float] = field(default_factory=list)  # one per output token
    error: str | None = None  # None when the request completed
    error_type: str | None = None  # rejected | aborted | connect | timeout | http_status | ...
    output_token_ids: list[int] | None = None
    server_prompt_tokens: int | None = None  # what an HTTP server's usage reported
    num_preemptions: int | None = None  # the engine's count; None: unknown (an HTTP run)
    first_scheduled_s: float | None = None  # in-process engine: admission time
    priority: int = 0
    session_id: int | str | None = None  # multi-turn workloads: the session
    turn: int | None = None  # multi-turn workloads: the turn, from 1
    turn_kind: str | None = None  # sessions: "user" or "tool" (a tool result's turn)
    agent: str | None = None  # sessions: the sub-agent the turn belongs to (None: the main one)
    # Sessions: when the turn's wait (think or tool time) began -- the end of every turn it
    # waited on (its agent's previous turn, that turn's sub-agents). None: a session's first.
    waited_from_s: float | None = None
    cancelled: bool = False  # --cancel-rate: the client gave up on it (not an error)
    worker: int | None = None  # HTTP runs: the load-generator worker that sent it (0..N-1)
    # HTTP targets (issue 20): what was asked and how the output was counted.
    slot_s: float | None = None  # --max-concurrency: when a slot freed (the client was ready)
    max_tokens: int | None = None  # the output length asked for
    output_tokens_method: str | None = None  # usage | events | tokenizer
    output_token_counts: dict[str, int] | None = None  # every count available, by method
    finish_reason: str | None = None  # the server's last finish_reason
    prompt_token_counts: dict[str, int] | None = None  # chat: {"chat_template": n} (client)
    # HTTP: the id the server gave the response (OpenAI's "id"): joins a record to the
    # server's own log line for the request. None when the server sent none.
    server_request_id: str | None = None
    # Issue 24: what the tokens were, and how many each stream event carried.
    # Tokens per timed event (parallel to token_times_s, HTTP), and how they were counted:
    # continuous_usage (exact) | tokenizer | one_per_event. None: one token per time (the
    # in-process engine, whose equal times mark the tokens of one step).
    event_tokens: list[int] | None = None
    event_tokens_method: str | None = None
    reasoning_tokens: int | None = None  # output tokens that were reasoning (None: unknown)
    first_output_s: float | None = None  # the first answer or tool-call token (not reasoning)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (None: unsent)
    tool_calls: list[dict] | None = None  # [{"id", "name", "argument_tokens"}] the reply made
    # Issue 27: the server's own timings of the request (vLLM's --enable-per-request-metrics
    # `metrics` object, as sent), and the TTFT / E2EL split made from them (ttft_breakdown.py).
    server_timing: dict | None = None
    ttft_parts: dict | None = None
    e2el_parts: dict | None = None
    # Issue 26. Images (chat): how many the request carried, their encoded bytes, and the
    # prompt tokens they cost by the server's usage (None: unknown, or no images).
    images: int | None = None
    image_bytes: int | None = None
    image_tokens: int | None = None
    request_bytes: int | None = None  # HTTP: the request body's size (payload bytes)
    inputs: int | None = None  # embeddings / rerank: inputs (documents) in the request
    # Issue 27: HTTP runs: the endpoint URL the request went to (several with --balance), and
    # the model it asked for (an adapter under --lora-modules, else the served model).
    endpoint: str | None = None
    model: str | None = None

    @property
    def ok(self) -> bool:
        """Completed: no error, not cancelled, at least one token."""
        return self.error is None and not self.cancelled and bool(self.token_times_s)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.intended_start_s if self.ok else None

    @property
    def e2el_s(self) -> float | None:
        return self.token_times_s[-1] - self.intended_start_s if self.ok else None

    @property
    def ready_s(self) -> float:
        """When the client was free to send: the intended start, or a slot's release."""
        return self.slot_s if self.slot_s is not None else self.intended_start_s

    @property
    def ttft_from_send_s(self) -> float | None:
        return self.token_times_s[0] - self.send_s if self.ok and self.send_s is not None else None

    @property
    def e2el_from_send_s(self) -> float | None:
        return self.token_times_s[-1] - self.send_s if self.ok and self.send_s is not None else None

    @property
    def ttfot_s(self) -> float | None:
        """Time to the first output token: the first answer or tool-call token, reasoning
        left out (AIPerf's and GuideLLM's TTFOT); equal to TTFT for a request that did not
        reason."""
        if not self.ok:
            return None
        first = self.first_output_s
        if first is None:
            return None if self.reasoning_tokens else self.ttft_s
        return first - self.intended_start_s

    def events(self) -> tuple[list[float], list[int]]:
        """(time, tokens) of each stream event: the recorded per-event counts, else runs of
        equal token times (one engine step's tokens) -- one token each when all differ."""
        times = self.token_times_s
        if self.event_tokens is not None:
            return times, self.event_tokens
        out_t: list[float] = []
        out_k: list[int] = []
        for t in times:
            if out_t and t == out_t[-1]:
                out_k[-1] += 1
            else:
                out_t.append(t)
                out_k.append(1)
        return out_t, out_k

    def event_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``events()`` as float64 times and counts, found with numpy (a run's summary takes
        them for every request: a Python loop over every token was its largest cost)."""
        t = np.asarray(self.token_times_s, dtype=np.float64)
        if self.event_tokens is not None:
            return t, np.asarray(self.event_tokens, dtype=np.float64)
        n = len(t)
        if n == 0:
            return t, np.zeros(0)
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(t[1:], t[:-1], out=new[1:])
        starts = np.flatnonzero(new)
        return t[starts], np.diff(np.append(starts, n)).astype(np.float64)

    @property
    def tpot_s(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1), vLLM's definition; None for one token."""
        if not self.ok or self.output_tokens <= 1:
            return None
        return (self.token_times_s[-1] - self.token_times_s[0]) / (self.output_tokens - 1)
