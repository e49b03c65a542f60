"""Speculative decoding: who proposes the draft tokens, and how many verification accepts.

Each step a running decode request carries up to K draft tokens (``req.spec_token_ids``); the
scheduler gives it 1 + drafts query rows (its latest token, then the drafts), the forward
verifies them all at once, and the request gains its accepted drafts plus one sampled token
(vLLM's and SGLang's scheme; docs/speculative.md).

Drafters, asked after every step for each request that will decode next:

- :class:`NgramDrafter` (the torch engine): prompt lookup. The longest suffix n-gram of the
  request's tokens (``NGRAM_MAX`` down to ``NGRAM_MIN``) is looked up earlier in its own
  prompt and output; the tokens that followed its most recent occurrence are the drafts. No
  draft model, no GPU work: a numpy scan of the request's history on the host.
- :class:`SimDrafter` (the simulator): K placeholder drafts (the simulator models no token
  ids); :class:`SimAcceptance` draws how many verification accepts.

Neither drafts past the request's output budget: with ``r`` tokens left a step can emit at
most ``r``, so at most ``r - 1`` drafts (plus the sampled token) are worth verifying.
"""

from __future__ import annotations

import random
from typing import Protocol

import numpy as np

from .request import Request

# Prompt lookup's n-gram sizes (vLLM's prompt_lookup_min / prompt_lookup_max): a 1-gram
# matches almost anywhere and drafts mostly noise, so matches start at 2 tokens.
NGRAM_MIN = 2
NGRAM_MAX = 4
# The simulator's drafts: it models no token ids.
PLACEHOLDER_TOKEN = -1
# The acceptance rate the simulator assumes when --acceptance-rate is not given: the issue's
# worked example (EAGLE-class drafters report 0.6-0.8 on chat; n-gram lookup far less).
DEFAULT_SIM_ACCEPTANCE_RATE = 0.7


def max_drafts(req: Request, k: int) -> int:
    """Drafts worth proposing for ``req``'s next step: K, less near the output budget."""
    return max(0, min(k, req.max_tokens - req.num_output_tokens - 1))


def expected_accepted_tokens(k: int, a: float) -> float:
    """E[accepted] = sum_{i=1..K} A^i when each draft is accepted with probability A given the
    ones before it were (K=3, A=0.7: 0.7 + 0.49 + 0.343 = 1.533)."""
    return sum(a**i for i in range(1, k + 1))


class Drafter(Protocol):
    def propose(self, req: Request) -> list[int]: ...


class SimDrafter:
    def __init__(self, k: int) -> None:
        self.k = k

    def propose(self, req: Request) -> list[int]:
        return [PLACEHOLDER_TOKEN] * max_drafts(req, self.k)


class SimAcceptance:
    """The simulator's verification: draft i (1-based) is accepted with probability A given
    drafts 1..i-1 were, so the accepted count of d drafts is min(d, Geometric) and its mean is
    sum_{i=1..d} A^i. Draws come from one RNG seeded with the engine seed, in scheduling order:
    the same run gives the same acceptances."""

    def __init__(self, acceptance_rate: float, seed: int = 0) -> None:
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance rate must be in [0, 1], got {acceptance_rate}")
        self.rate = acceptance_rate
        self._rng = random.Random(seed)

    def accepted(self, num_drafts: int) -> int:
        rnd, a = self._rng.random, self.rate
        n = 0
        while n < num_drafts and rnd() < a:
            n += 1
        return n


class NgramDrafter:
    """Prompt-lookup drafts from the request's own token ids (prompt and outputs). Each
    request's ids are kept in a numpy array sized for its whole life (prompt + max tokens) and
    extended by the tokens it gained, so a lookup scans memory it already has instead of
    converting the token list every step."""

    # Forget finished requests' arrays after this many new ones.
    PRUNE_EVERY = 256

    def __init__(self, k: int, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.k = k
        self.min_n = min_n
        self.max_n = max_n
        self._ids: dict[Request, tuple[np.ndarray, int]] = {}  # the array, ids filled
        self._added = 0

    def propose(self, req: Request) -> list[int]:
        k = max_drafts(req, self.k)
        # Greedy acceptance only: a sampled request (temperature > 0) would need rejection
        # sampling to keep its output distribution, so it does not draft.
        if k == 0 or req.prompt_token_ids is None or not req.sampling.greedy:
            return []
        arr, length = self._token_array(req)
        return ngram_lookup_array(arr[:length], k, self.min_n, self.max_n)

    def _token_array(self, req: Request) -> tuple[np.ndarray, int]:
        entry = self._ids.get(req)
        out = req.output_token_ids
        p = req.num_prompt_tokens
        if entry is None:
            self._prune()
            arr = np.empty(req.max_total_tokens, dtype=np.int64)
            arr[:p] = req.prompt_token_ids
            filled = p
        else:
            arr, filled = entry
        length = p + len(out)
        if length > filled:
            arr[filled:length] = out[filled - p :]
            self._ids[req] = (arr, length)
        return arr, length

    def _prune(self) -> None:
        self._added += 1
        if self._added % self.PRUNE_EVERY == 0:
            self._ids = {r: v for r, v in self._ids.items() if not r.status.is_done}


def ngram_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest
    suffix n-gram of ``tokens`` (n from ``max_n`` down to ``min_n``); [] when none recurs."""
    return ngram_lookup_array(np.asarray(tokens, dtype=np.int64), k, min_n, max_n)


def ngram_lookup_array(arr: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """:func:`ngram_lookup` on an int64 array of the token ids."""
    length = arr.shape[0]
    if length < min_n + 1:
        return []
    # Candidates: earlier positions p holding the last token (p <= length - 2, so a token
    # follows), then how far back each match extends: arr[p - j] == arr[length - 1 - j].
    ends = np.flatnonzero(arr[:-1] == arr[-1])
    if ends.size == 0:
        return []
    matched = np.ones(ends.size, dtype=bool)
    run = np.ones(ends.size, dtype=np.int64)  # match length of each candidate, up to max_n
    for j in range(1, min(max_n, length - 1)):
        back = ends - j
        matched &= back >= 0
        matched[matched] = arr[back[matched]] == arr[length - 1 - j]
        if not matched.any():
            break
        run += matched
    best = int(run.max())
    if best < min_n:
        return []
    start = int(ends[np.flatnonzero(run == best)[-1]]) + 1  # the most recent longest match
    return arr[start : start + k].tolist()


def accept_greedy(
    reqs: list[Request], row_reqs: list[int], row_tokens: list[int], sampled: list[int | None]
) -> list[int]:
    """Greedy verification. ``row_tokens`` are the argmax tokens of the sampled rows, whose
    requests ``row_reqs`` lists (a verify's 1 + d rows in order). Draft j is accepted while it
    equals the argmax after the tokens before it; the argmax at the first mismatch (or after
    the last draft) is the request's sampled token, written into ``sampled``. Returns the
    accepted count per request. A greedy output is therefore what decoding one token per step
    gives: every token kept is the model's argmax given the tokens before it."""
    accepted = [0] * len(reqs)
    r = 0
    while r < len(row_reqs):
        i = row_reqs[r]
        spec = reqs[i].spec_token_ids
        a = 0
        while a < len(spec) and spec[a] == row_tokens[r + a]:
            a += 1
        accepted[i] = a
        sampled[i] = row_tokens[r + a]
        r += len(spec) + 1
    return accepted
