"""What the scheduler hands the executor each iteration, what the executor returns, and what the
step costs (its batch shape; the bytes, FLOPs and predicted time the simulator's cost model
gives it: engine/sim/cost_model.py builds these records, the engine core only reads them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .request import Request


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
    # ... and the same for requests resumed after a recompute preemption (kept apart, as vLLM's
    # preempted_hits and preempted_queries: they find their own blocks again).
    num_preempted_cached_tokens: int = 0
    num_preempted_queried_tokens: int = 0
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


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What the cost depends on: token counts and attention work, not request identities."""

    num_tokens: int
    num_logits: int  # rows that sample
    attn_key_pairs: float  # sum over rows of keys attended
    attn_keys_read: float  # keys read from the cache, summed over requests
    num_reqs: int = 1  # requests in the batch (the per-row overhead's count)
    num_prefill_reqs: int = 0  # of which with prefill rows
    decode_keys: float = 0.0  # keys the decode rows read: part of both above
    # Speculative decoding's draft rows (decode rows beyond one per decode request). Their
    # key pairs beyond decode_keys are costed with the prefill rows' attention (a multi-row
    # query against a context: the same work as a prefill chunk's).
    num_draft_tokens: int = 0

    @staticmethod
    def decodes(num_rows: int, keys: float) -> BatchShape:
        """``num_rows`` decode rows alone, reading ``keys`` keys in all: what
        ``from_scheduler_output`` gives such a step."""
        return BatchShape(num_rows, num_rows, keys, keys, num_rows, 0, keys)

    @staticmethod
    def from_scheduler_output(sched: SchedulerOutput) -> BatchShape:
        reqs = sched.scheduled_reqs
        nd = sched.num_decode_reqs
        # A decode row with c computed tokens attends c + 1 keys and reads them all.
        dec_keys = sum([r.num_computed_tokens for r in reqs[:nd]]) + nd
        pairs = float(dec_keys)
        num_logits = nd
        if sched.num_draft_tokens:
            # Speculative decoding: a decode with d drafts verifies d + 1 rows, each sampled,
            # row j attending the c + 1 + j keys before it (causal): one read of c + 1 + d keys
            # (the decode kernel reads a request's KV once for all its rows), and
            # d (c + 1) + d (d + 1) / 2 key pairs more than the plain decode.
            for r in reqs[:nd]:
                d = len(r.spec_token_ids)
                if d:
                    pairs += d * (r.num_computed_tokens + 1) + d * (d + 1) / 2
            dec_keys += sched.num_draft_tokens
            num_logits += sched.num_draft_tokens
        keys_read = float(dec_keys)
        nums = sched.num_scheduled_tokens
        for i in range(nd, len(reqs)):
            r = reqs[i]
            n = nums[i]
            c = r.num_computed_tokens
            pairs += n * c + n * (n + 1) / 2
            keys_read += c + n
            if c + n == r.num_tokens:
                num_logits += 1
        return BatchShape(sched.total_tokens, num_logits, pairs, keys_read, len(reqs),
                          len(reqs) - nd, float(dec_keys), sched.num_draft_tokens)


@dataclass(frozen=True, slots=True)
class IterationCost:
    bytes: float  # per GPU
    flops: float  # per GPU
    time_s: float | None  # roofline prediction, overheads included; None without rates
    shape: BatchShape | None = None
