"""Per-request measurements, the same for every target (in-process engine or HTTP)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    num_preemptions: int = 0
    first_scheduled_s: float | None = None  # in-process engine: admission time
    priority: int = 0
    session_id: int | str | None = None  # multi-turn workloads: the session
    turn: int | None = None  # multi-turn workloads: the turn, from 1
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
    def tpot_s(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1), vLLM's definition; None for one token."""
        if not self.ok or self.output_tokens <= 1:
            return None
        return (self.token_times_s[-1] - self.token_times_s[0]) / (self.output_tokens - 1)
