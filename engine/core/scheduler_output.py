"""What the scheduler hands the executor each iteration, and what the executor returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .request import Request

if TYPE_CHECKING:
    from ..sim.cost_model import IterationCost


@dataclass(slots=True)
class SchedulerOutput:
    # Parallel lists in execution order: decode rows first, then prefill chunks.
    scheduled_reqs: list[Request]
    num_scheduled_tokens: list[int]
    # The first num_decode_reqs entries are decodes: 1 token each, or with speculative decoding
    # 1 + len(req.spec_token_ids) (its latest token, then the drafts to verify).
    num_decode_reqs: int
    num_prefill_tokens: int
    token_budget: int
    preempted: list[Request] = field(default_factory=list)
    # Swap preemption: KV block copies the executor does before the forward, swap-outs first:
    # (GPU block, CPU block) pairs out, then (CPU block, GPU block) pairs in. A GPU block freed
    # by a swap-out may be the destination of a swap-in or hold new KV in the same step.
    swap_out: Sequence[tuple[int, int]] = ()
    swap_in: Sequence[tuple[int, int]] = ()
    # Prefix caching: tokens found cached among the requests that started a prefill this step,
    # and those requests' known tokens (what was looked up).
    num_cached_tokens: int = 0
    num_prefix_queried_tokens: int = 0
    # Speculative decoding: decodes with draft rows, and the draft rows (of the decode rows).
    num_drafts: int = 0
    num_draft_tokens: int = 0

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decode_reqs + self.num_draft_tokens

    @property
    def num_prefill_reqs(self) -> int:
        return len(self.scheduled_reqs) - self.num_decode_reqs

    @property
    def total_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.scheduled_reqs

    @property
    def has_swaps(self) -> bool:
        return bool(self.swap_out or self.swap_in)


@dataclass(slots=True)
class ExecutorOutput:
    # One entry per scheduled request, aligned with SchedulerOutput.scheduled_reqs: the sampled
    # token id, or None where no token is produced (a partial prefill chunk) or ids are not
    # modelled (the simulator, which sets sampled_token_ids to None altogether).
    sampled_token_ids: list[int | None] | None
    # Speculative decoding: per scheduled request, how many of its draft tokens verification
    # accepted (leading drafts only; 0 for a request without drafts); None when no request had
    # drafts. The request then gains its accepted drafts and, after them, the sampled token
    # above (the correction at the first rejected position, or the bonus token after the last
    # draft).
    num_accepted: list[int] | None = None
    # Predicted duration for simulated execution; None when the executor really ran (the engine
    # reads its clock instead).
    duration_s: float | None = None
    swap_time_s: float = 0.0  # KV copies to and from the CPU pool (part of the duration)
    # The simulator's cost of this step (analytic bytes/FLOPs, prediction); a real executor
    # leaves it None and the engine asks its cost model.
    cost: IterationCost | None = None

    @property
    def bytes_moved(self) -> float:  # analytic, for the iteration record
        return self.cost.bytes if self.cost is not None else 0.0

    @property
    def flops(self) -> float:
        return self.cost.flops if self.cost is not None else 0.0
