"""What the scheduler hands the executor each iteration, and what the executor returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import Request


@dataclass(slots=True)
class SchedulerOutput:
    # Parallel lists in execution order: decode rows first, then prefill chunks.
    scheduled_reqs: list[Request]
    num_scheduled_tokens: list[int]
    num_decode_reqs: int  # the first num_decode_reqs entries are decodes (1 token each)
    num_prefill_tokens: int
    token_budget: int
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decode_reqs

    @property
    def num_prefill_reqs(self) -> int:
        return len(self.scheduled_reqs) - self.num_decode_reqs

    @property
    def total_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_reqs

    @property
    def is_empty(self) -> bool:
        return not self.scheduled_reqs


@dataclass(slots=True)
class ExecutorOutput:
    # One entry per scheduled request, aligned with SchedulerOutput.scheduled_reqs: the sampled
    # token id, or None where no token is produced (a partial prefill chunk) or ids are not
    # modelled (the simulator, which sets sampled_token_ids to None altogether).
    sampled_token_ids: list[int | None] | None
    # Predicted duration for simulated execution; None when the executor really ran (the engine
    # reads its clock instead).
    duration_s: float | None = None
    bytes_moved: float = 0.0  # analytic, for the iteration record
    flops: float = 0.0
