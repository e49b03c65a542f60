"""Token sampling: greedy, temperature, top-k and top-p, seeded per request.

Greedy rows are one batched argmax. Random rows use the exponential-race form of categorical
sampling, ``argmax(probs / E)`` with ``E ~ Exp(1)`` drawn per row, so everything except drawing
``E`` is batched. Each row's ``E`` comes from its own generator, seeded from the request's seed,
its id and its token count: a request's samples depend only on itself, never on which other
requests share its batch or in which order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .request import Request

# Mixing constants (64-bit golden ratio and a SplitMix64 multiplier) so nearby
# (seed, request id, position) triples give unrelated generator seeds.
_MIX_A = 0x9E3779B97F4A7C15
_MIX_B = 0xBF58476D1CE4E5B9
_SEED_MASK = (1 << 63) - 1  # torch.Generator.manual_seed takes a non-negative int64


def row_seed(base_seed: int, request_id: int, num_tokens: int) -> int:
    """The generator seed for one request's sample at one position."""
    x = (base_seed * _MIX_A + request_id) & ((1 << 64) - 1)
    x = (x * _MIX_B + num_tokens) & ((1 << 64) - 1)
    x ^= x >> 31
    return x & _SEED_MASK


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Per-row sampling parameters, one row per logits row."""

    temperatures: list[float]
    top_ks: list[int]
    top_ps: list[float]
    seeds: list[int]  # generator seed per row (ignored for greedy rows)

    @classmethod
    def from_requests(cls, reqs: Sequence[Request], default_seed: int = 0) -> SamplingBatch:
        """Seeds use ``req.num_tokens``: the count before the sampled token is appended."""
        temps, ks, ps, seeds = [], [], [], []
        for req in reqs:
            sp = req.sampling
            temps.append(sp.temperature)
            ks.append(sp.top_k)
            ps.append(sp.top_p)
            base = default_seed if sp.seed is None else sp.seed
            seeds.append(row_seed(base, int(req.request_id), req.num_tokens))
        return cls(temps, ks, ps, seeds)


class Sampler:
    def __init__(self, default_seed: int = 0) -> None:
        # Used for requests without their own seed, so a whole benchmark run is reproducible.
        self.default_seed = default_seed

    def __call__(self, logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
        """float32 logits [N, vocab], one row per request -> token ids int64 [N]."""
        return self.sample(logits, SamplingBatch.from_requests(reqs, self.default_seed))

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, t in enumerate(batch.temperatures) if t > 0.0]
        if not random_rows:
            return tokens
        device = logits.device
        rows = torch.tensor(random_rows, device=device)
        temps = torch.tensor(_pick(batch.temperatures, random_rows), device=device)
        scaled = logits[rows] / temps.unsqueeze(1)
        scaled = _apply_top_k_top_p(
            scaled, _pick(batch.top_ks, random_rows), _pick(batch.top_ps, random_rows)
        )
        probs = torch.softmax(scaled, dim=-1)
        noise = torch.stack(
            [_exponential(probs.shape[1], s, device) for s in _pick(batch.seeds, random_rows)]
        )
        tokens[rows] = (probs / noise).argmax(dim=-1)
        return tokens


def _pick(values: list, rows: list[int]) -> list:
    return [values[i] for i in rows]


def _exponential(size: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    noise = torch.empty(size, device=device).exponential_(generator=gen)
    # An exact 0 would turn a masked token's 0 / 0 into nan.
    return noise.clamp_(min=torch.finfo(noise.dtype).tiny)


def _apply_top_k_top_p(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]):
    """Mask to -inf everything outside each row's top-k, then outside its top-p nucleus."""
    use_k = any(k > 0 for k in top_ks)
    use_p = any(p < 1.0 for p in top_ps)
    if not (use_k or use_p):
        return logits
    vocab = logits.shape[1]
    if not use_p:
        return _apply_top_k(logits, top_ks)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_k:
        k = torch.tensor([k if k > 0 else vocab for k in top_ks], device=logits.device)
        drop |= ranks >= k.unsqueeze(1)
    if use_p:
        p = torch.tensor(top_ps, device=logits.device, dtype=logits.dtype)
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # Keep a token while the mass before it is below p: the top token always survives.
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _apply_top_k(logits: torch.Tensor, top_ks: list[int]) -> torch.Tensor:
    """Top-k alone needs no full-vocabulary sort: one top-max(k) pass gives each row's k-th
    value as its threshold (tokens tied with it are kept too); rows with k = 0 keep all."""
    vocab = logits.shape[1]
    ks = [min(k, vocab) for k in top_ks]
    values = logits.topk(max(ks), dim=-1).values  # sorted, descending
    kth = torch.tensor([max(k, 1) - 1 for k in ks], device=logits.device).unsqueeze(1)
    threshold = values.gather(1, kth)
    off = torch.tensor([k == 0 for k in ks], device=logits.device).unsqueeze(1)
    threshold = threshold.masked_fill(off, float("-inf"))
    return logits.masked_fill(logits < threshold, float("-inf"))
