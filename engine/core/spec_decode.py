"""Speculative decoding: who proposes the draft tokens, and how many verification accepts.

Each step a running decode request carries up to K draft tokens (``req.spec_token_ids``); the
scheduler gives it 1 + drafts query rows (its latest token, then the drafts), the forward
verifies them all at once, and the request gains its accepted drafts plus one sampled token
(vLLM's and SGLang's scheme; docs/speculative.md).

Drafters, asked after every step for each request that will decode next:

- :class:`NgramDrafter` (the torch engine): prompt lookup. The longest suffix n-gram of the
  request's tokens (``NGRAM_MAX`` down to ``NGRAM_MIN``) is looked up earlier in its own
  prompt and output; the tokens that followed its earliest occurrence are the drafts (vLLM's
  NgramProposer: its KMP keeps the first position of the longest match). No draft model, no
  GPU work: a per-request index of token positions on the host.
- :class:`SimDrafter` (the simulator): K placeholder drafts (the simulator models no token
  ids); :class:`SimAcceptance` draws how many verification accepts.

Neither drafts past the request's output budget: with ``r`` tokens left a step can emit at
most ``r``, so at most ``r - 1`` drafts (plus the sampled token) are worth verifying.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

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
    """Prompt-lookup drafts from the request's own token ids (prompt and outputs).

    Each request keeps an index: its ids so far and, per ``min_n``-gram, the positions where
    it ends, extended by the tokens gained since the last call. A lookup walks only the
    earlier occurrences of the suffix ``min_n``-gram, earliest first, extending each match
    backwards, and stops at the first of ``max_n`` tokens: microseconds on most histories (a
    numpy scan of the whole history cost ~100 µs per request per step at 1,000 tokens)."""

    # Forget finished requests' indices after this many new ones.
    PRUNE_EVERY = 256

    def __init__(self, k: int, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.k = k
        self.min_n = min_n
        self.max_n = max_n
        self._index: dict[Request, TokenIndex] = {}
        self._added = 0

    def propose(self, req: Request) -> list[int]:
        k = max_drafts(req, self.k)
        # Greedy acceptance only: a sampled request (temperature > 0) would need rejection
        # sampling to keep its output distribution, so it does not draft.
        if k == 0 or req.prompt_token_ids is None or not req.sampling.greedy:
            return []
        index = self._index.get(req)
        if index is None:
            self._prune()
            index = self._index[req] = TokenIndex(req.prompt_token_ids, self.min_n)
        out = req.output_token_ids
        done = len(index.tokens) - req.num_prompt_tokens
        if len(out) > done:
            index.extend(out[done:])
        return index.lookup(k, self.max_n)

    def _prune(self) -> None:
        self._added += 1
        if self._added % self.PRUNE_EVERY == 0:
            self._index = {r: v for r, v in self._index.items() if not r.status.is_done}


class TokenIndex:
    """A token sequence and, per n-gram of ``key_len`` tokens (the shortest match that
    counts), the positions where it ends (ascending)."""

    __slots__ = ("tokens", "positions", "key_len")

    def __init__(self, tokens: Sequence[int], key_len: int) -> None:
        self.tokens: list[int] = []
        self.positions: dict = {}  # key (see _key) -> end positions
        self.key_len = key_len
        self.extend(tokens)

    def extend(self, new: Sequence[int]) -> None:
        tokens, positions, kl = self.tokens, self.positions, self.key_len
        first = max(len(tokens), kl - 1)
        tokens.extend(new)
        if kl == 2:  # the default, inlined: a dict of packed ints
            prev = tokens[first - 1]
            for end in range(first, len(tokens)):
                t = tokens[end]
                key = prev << 32 | t
                prev = t
                where = positions.get(key)
                if where is None:
                    positions[key] = [end]
                else:
                    where.append(end)
            return
        for end in range(first, len(tokens)):
            key = self._key(end)
            where = positions.get(key)
            if where is None:
                positions[key] = [end]
            else:
                where.append(end)

    def _key(self, end: int):
        """The key of the n-gram ending at ``end``: the token itself, a pair packed in one
        int (token ids are below 2^32), or a tuple for longer keys."""
        tokens, kl = self.tokens, self.key_len
        if kl == 1:
            return tokens[end]
        if kl == 2:
            return tokens[end - 1] << 32 | tokens[end]
        return tuple(tokens[end - kl + 1 : end + 1])

    def lookup(self, k: int, max_n: int) -> list[int]:
        """Up to ``k`` tokens that followed the earliest occurrence of the longest suffix
        n-gram (``key_len`` <= n <= ``max_n``); [] when none recurs. vLLM's NgramProposer
        picks the same (its KMP updates the position on ties, scanning the reversed tokens),
        so every occurrence is tried, as its scan does: the latest one drafted other tokens
        and accepted other counts."""
        tokens, kl = self.tokens, self.key_len
        last = len(tokens) - 1
        if last < kl:
            return []
        where = self.positions[self._key(last)]
        best_n, best_end = 0, -1
        for j in range(len(where) - 1):  # earlier occurrences, the earliest first
            p = where[j]
            n = kl
            while n < max_n and n <= p and tokens[p - n] == tokens[last - n]:
                n += 1
            if n > best_n:
                best_n, best_end = n, p
                if n == max_n:
                    break
        if best_end < 0:
            return []
        return tokens[best_end + 1 : best_end + 1 + k]


def ngram_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest occurrence of the longest suffix
    n-gram of ``tokens`` (n from ``max_n`` down to ``min_n``); [] when none recurs."""
    return TokenIndex(tokens, min_n).lookup(k, max_n)


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
