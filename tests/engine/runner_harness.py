"""The torch model runner driven by hand (the engine's part played by the test): a tiny model,
a block allocator and a Harness that schedules, runs and advances requests; shared by the
model-runner and sampling-slot tests."""

from __future__ import annotations

import torch

from cbbench.engine.core.request import Request, SamplingParams
from cbbench.engine.core.scheduler_output import SchedulerOutput
from cbbench.engine.torch.model_runner import ModelRunner
from cbbench.engine.torch.models import allocate_kv_cache, load_model
from cbbench.kernels import get_backend

BLOCK_SIZE = 4
NUM_BLOCKS = 64
VOCAB = 512  # the tiny preset's


class BlockAllocator:
    """Hands out blocks in a scrambled order so request tables are never contiguous."""

    def __init__(self, num_blocks: int) -> None:
        self.free = [(7 * i + 3) % num_blocks for i in range(num_blocks)]  # a permutation

    def cover(self, req: Request, num_tokens: int) -> None:
        while len(req.block_table) * BLOCK_SIZE < num_tokens:
            req.block_table.append(self.free.pop(0))


class Harness:
    """A runner plus the engine's bookkeeping, for one backend."""

    def __init__(self, backend: str = "reference", **runner_kwargs) -> None:
        attn = get_backend(backend, "cpu")
        self.model, self.config = load_model("tiny", torch.float32, "cpu", attn, seed=0)
        self.kv_caches = allocate_kv_cache(
            self.config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, "cpu"
        )
        self.runner = ModelRunner(
            self.model,
            self.config,
            self.kv_caches,
            BLOCK_SIZE,
            "cpu",
            torch.float32,
            **runner_kwargs,
        )
        self.alloc = BlockAllocator(NUM_BLOCKS)

    def schedule(self, work: list[tuple[Request, int]]) -> SchedulerOutput:
        """Decodes (n == 1 with the request past its prompt) must come first, as the scheduler's do."""
        for req, n in work:
            self.alloc.cover(req, req.num_computed_tokens + n)
        num_decode = 0
        while num_decode < len(work) and _is_decode(*work[num_decode]):
            num_decode += 1
        counts = [n for _, n in work]
        return SchedulerOutput(
            scheduled_reqs=[r for r, _ in work],
            num_scheduled_tokens=counts,
            num_decode_reqs=num_decode,
            num_prefill_tokens=sum(counts[num_decode:]),
            token_budget=sum(counts),
        )

    def step(self, work: list[tuple[Request, int]]) -> list[int | None]:
        sched = self.schedule(work)
        out = self.runner.execute(sched)
        _advance(sched, out.sampled_token_ids)
        return out.sampled_token_ids

    def all_row_logits(self, sched: SchedulerOutput) -> torch.Tensor:
        """Logits of every packed row (the runner itself only computes the sampled rows)."""
        batch = self.runner.prepare(sched)
        with torch.inference_mode():
            hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.metadata)
            return self.model.compute_logits(hidden)


def _is_decode(req: Request, n: int) -> bool:
    return n == 1 and req.num_computed_tokens >= req.num_prompt_tokens


def _advance(sched: SchedulerOutput, sampled: list[int | None]) -> None:
    """What the engine does after execute."""
    for req, n, token in zip(
        sched.scheduled_reqs, sched.num_scheduled_tokens, sampled, strict=True
    ):
        req.num_computed_tokens += n
        if token is not None:
            req.output_token_ids.append(token)
            req.num_output_tokens += 1


def prompt_ids(req_id: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(100 + req_id)
    return torch.randint(0, VOCAB, (length,), generator=g).tolist()


def make_request(req_id: int, prompt_len: int, sampling: SamplingParams | None = None) -> Request:
    kwargs = {} if sampling is None else {"sampling": sampling}
    return Request(req_id, prompt_len, 16, prompt_token_ids=prompt_ids(req_id, prompt_len), **kwargs)
