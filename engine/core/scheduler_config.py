"""The scheduler's budgets and policies, checked at construction."""

from __future__ import annotations

from dataclasses import dataclass

from ..args import DEFAULT_MAX_NUM_SEQS, PREEMPTION_MODES, QUEUE_POLICIES
from ..args import SCHEDULERS as BATCHING_POLICIES

# vLLM's default budget with chunked prefill; without chunking the budget admits any prompt the
# model takes.
DEFAULT_CHUNKED_BUDGET = 2048


def default_max_num_batched_tokens(chunked_prefill: bool, max_model_len: int) -> int:
    if chunked_prefill:
        return DEFAULT_CHUNKED_BUDGET
    return max(max_model_len, DEFAULT_CHUNKED_BUDGET)


@dataclass(frozen=True)
class SchedulerConfig:
    max_model_len: int
    batching: str = "continuous"  # continuous | static
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_CHUNKED_BUDGET
    chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    # vLLM's ``--policy``: the order of the waiting queue (the CLI's --policy).
    queue_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.batching not in BATCHING_POLICIES:
            names = ", ".join(BATCHING_POLICIES)
            raise ValueError(f"unknown scheduler {self.batching!r}: use {names}")
        if self.preemption_mode not in PREEMPTION_MODES:
            modes = ", ".join(PREEMPTION_MODES)
            raise ValueError(f"unknown preemption mode {self.preemption_mode!r}: use {modes}")
        if self.queue_policy not in QUEUE_POLICIES:
            raise ValueError(
                f"unknown scheduling policy {self.queue_policy!r}: use {', '.join(QUEUE_POLICIES)}"
            )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_model_len must be >= 1")
