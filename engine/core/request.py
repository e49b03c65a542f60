"""Request / sequence state, in vLLM's vocabulary.

A request holds ``num_tokens`` known tokens (prompt + outputs so far) of which
``num_computed_tokens`` already have their KV in the cache. Each iteration the scheduler gives it
``n`` new tokens to compute; when that brings ``num_computed_tokens`` up to ``num_tokens`` the
executor samples one more token. A decode is simply n = 1; a prefill chunk is n > 1. With
speculative decoding a decode carries draft tokens (``spec_token_ids``): n = 1 + drafts, and the
step may add several tokens (the accepted drafts, then one sampled token). Recompute
preemption resets ``num_computed_tokens`` to 0, so the next prefill covers prompt + outputs; swap
preemption keeps it (the KV waits in CPU memory, in ``cpu_block_table``, status SWAPPED) and the
request resumes where it stopped once its blocks are copied back.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # by recompute: waits with no KV
    SWAPPED = 3  # by swap: waits with its KV in the CPU pool
    FINISHED = 4
    ABORTED = 5
    REJECTED = 6
    FAILED = 7  # the executor raised during one of its steps (Engine.step: StepFailed)

    @property
    def is_done(self) -> bool:
        return self >= RequestStatus.FINISHED


# Values a float32 sampler cannot use are normalized when a request is made, so no request's
# values can break a batch: a temperature or top-p below SAMPLING_EPS underflows (NaN
# probabilities), so both mean greedy (vLLM's _SAMPLING_EPS rule); a top-k of MAX_TOP_K or more
# keeps every token of any vocabulary, so it means off (and never overflows an int64 tensor);
# a seed of any size wraps into int64 (two's complement), the range vLLM's API accepts, so each
# accepted seed, negative ones included, stays its own (the sampler hashes all 64 bits). A
# temperature above MAX_TEMPERATURE samples as MAX_TEMPERATURE does: float32 logits divided by
# it are already equal to within float32's resolution after softmax (uniform over what top-k
# and top-p keep), while a larger one loses their order (beyond float32's 3.4e38 each logit
# becomes 0, and `top_k: 1` drew random tokens).
SAMPLING_EPS = 1e-5
MAX_TEMPERATURE = 1e12
MAX_TOP_K = 2**31
TOP_K_OFF = -1  # vLLM's SamplingParams: 0 or -1 keeps every token
INT64_MIN = -(2**63)
INT64_SPAN = 2**64


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    ignore_eos: bool = True  # benchmarks follow the workload's output lengths by default
    # Token ids that finish the request ("stop") when sampled, ignore_eos or not (vLLM's
    # stop_token_ids: the token is an output token, its text is not written).
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.temperature < SAMPLING_EPS or self.top_p < SAMPLING_EPS:
            object.__setattr__(self, "temperature", 0.0)
        elif self.temperature > MAX_TEMPERATURE:
            object.__setattr__(self, "temperature", MAX_TEMPERATURE)
        if self.top_k >= MAX_TOP_K or self.top_k == TOP_K_OFF:
            object.__setattr__(self, "top_k", 0)
        if self.seed is not None and not INT64_MIN <= self.seed < INT64_MIN + INT64_SPAN:
            object.__setattr__(self, "seed", (self.seed - INT64_MIN) % INT64_SPAN + INT64_MIN)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


class Request:
    """Mutable per-request state. ``__slots__`` because the scheduler touches these fields for
    every running request on every iteration."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "num_prompt_tokens",
        "max_tokens",
        "arrival_time",
        "sampling",
        "priority",
        "eos_token_ids",
        "status",
        "output_token_ids",
        "num_output_tokens",
        "num_computed_tokens",
        "block_table",
        "first_scheduled_time",
        "token_times",
        "finish_time",
        "num_preemptions",
        "finish_reason",
        "cpu_block_table",
        "queue_seq",
        "block_hashes",
        "num_registered_blocks",
        "num_cached_tokens",
        "num_computed_at_admission",
        "spec_token_ids",
        "encoder_flops",
        "pooling",
        "pooled_hidden",
    )

    def __init__(
        self,
        request_id: int,
        num_prompt_tokens: int,
        max_tokens: int,
        arrival_time: float = 0.0,
        prompt_token_ids: Sequence[int] | None = None,
        sampling: SamplingParams = GREEDY,
        priority: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        encoder_flops: float = 0.0,
    ) -> None:
        if prompt_token_ids is not None and len(prompt_token_ids) != num_prompt_tokens:
            raise ValueError("num_prompt_tokens must equal len(prompt_token_ids)")
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.sampling = sampling
        self.priority = priority
        # A sampled token among these finishes the request ("stop") unless it ignores EOS: the
        # model's end-of-sequence ids, every one (Hugging Face's generate stops on any).
        self.eos_token_ids = eos_token_ids
        self.status = RequestStatus.WAITING
        # Token ids are kept only when the executor produces them (torch); the simulator only
        # counts tokens.
        self.output_token_ids: list[int] = []
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.first_scheduled_time: float | None = None
        self.token_times: list[float] = []
        self.finish_time: float | None = None
        self.num_preemptions = 0
        # "length" | "stop" | "abort" | rejection reason | failure reason (status FAILED)
        self.finish_reason: str | None = None
        # Swap preemption: the CPU blocks holding this request's KV while it is SWAPPED.
        self.cpu_block_table: list[int] = []
        # Order of arrival at the scheduler: the tie-break after priority and arrival time.
        self.queue_seq = 0
        # Prefix caching: content hashes of the leading full blocks (a cache: token ids never
        # change, so they stay valid across preemptions), how many leading blocks of
        # block_table are registered in the prefix cache, the prompt tokens found cached at the
        # first scheduling (vLLM's num_cached_tokens, set once: what usage reports; a resume
        # after a preemption does not change it), and the tokens found cached at the latest
        # admission (where that admission's prefill starts).
        self.block_hashes: list[int] = []
        self.num_registered_blocks = 0
        self.num_cached_tokens = 0
        self.num_computed_at_admission = 0
        # Speculative decoding: the draft tokens proposed after this request's latest token,
        # verified at its next decode step (they are not in num_tokens until accepted). The
        # scheduler trims them to what it schedules; a preemption drops them. The simulator's
        # drafts are placeholders (it models no token ids).
        self.spec_token_ids: list[int] = []
        # A multimodal request's vision-encoder work (FLOPs), run with the first prefill chunk
        # after each admission (the simulator charges it; cbbench/server/images.py sets it).
        self.encoder_flops = encoder_flops
        # An embeddings request (cbbench serve's /v1/embeddings on the torch engine): the
        # executor keeps the final hidden state of the row it samples after the prefill (the
        # last prompt token: vLLM's LAST pooling) in pooled_hidden (a float32 CPU tensor).
        self.pooling = False
        self.pooled_hidden: Any = None  # a torch tensor; the core imports no torch

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def max_total_tokens(self) -> int:
        """Prompt plus every output token: what reserved allocation sets aside."""
        return self.num_prompt_tokens + self.max_tokens

    @property
    def num_known_token_ids(self) -> int:
        """Leading tokens whose ids are known: none for a length-only request; the prompt plus
        the sampled outputs otherwise (the simulator samples lengths, not ids)."""
        if self.prompt_token_ids is None:
            return 0
        return self.num_prompt_tokens + len(self.output_token_ids)

    def token_ids_slice(self, start: int, end: int) -> Sequence[int]:
        """Known token ids in [start, end): prompt then outputs (ids must be known). The prompt
        may be any sequence (a trace's hash blocks, read on demand: load/hash_blocks.py)."""
        prompt = self.prompt_token_ids
        assert prompt is not None, "token ids are unknown for a length-only request"
        p = self.num_prompt_tokens
        if end <= p:
            return prompt[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return [*prompt[start:], *self.output_token_ids[: end - p]]

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id}, status={self.status.name}, "
            f"prompt={self.num_prompt_tokens}, out={self.num_output_tokens}/{self.max_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
