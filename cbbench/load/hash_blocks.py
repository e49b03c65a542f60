"""Mooncake's hash blocks as token ids: each hash id names one 512-token block of a prompt, and
always gives the same ids, so the engine's prefix cache sees a trace's real sharing."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512
# Block contents: ids below 512 are valid for every model preset, the tiny test ones included.
TRACE_VOCAB = 512
HASH_BLOCK_SEED = 20250225  # FAST'25: fixed, so a hash id means the same block on every run
UNIQUE_TAIL_STREAM = 1
# One int object per id value, shared by every block: numpy's tolist() makes a new object for
# each id above 256 (32 bytes each, 4x the tuple's own slot), and blocks held 12 MB a thousand.
_ID_OBJECTS = np.array(range(TRACE_VOCAB), dtype=object)


@functools.lru_cache(maxsize=1 << 14)
def hash_block_ids(hash_id: int) -> tuple[int, ...]:
    """The 512 token ids of one hash block: the same on every run."""
    rng = np.random.default_rng([HASH_BLOCK_SEED, hash_id])
    return tuple(_ID_OBJECTS[rng.integers(0, TRACE_VOCAB, MOONCAKE_BLOCK_TOKENS)])


class HashBlockIds(Sequence[int]):
    """A trace request's prompt ids, made from its hash blocks when read: the hash blocks in
    order (the last one cut to the prompt's length), then, where the trace names fewer blocks
    than the prompt fills, ids of this request alone. Holds no ids of its own (the blocks are
    the shared, cached ones), so an engine run of a trace keeps no copy of every prompt: the
    prefix cache reads each block once, when it hashes the request; 3,000 prompts of ~12k
    tokens held 0.7 GB as lists before the first request was sent."""

    __slots__ = ("request_id", "hash_ids", "length", "_tail")

    def __init__(self, request_id: int, hash_ids: tuple[int, ...], prompt_len: int) -> None:
        self.request_id = request_id
        self.hash_ids = hash_ids
        self.length = prompt_len
        self._tail: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return self.length

    def tail(self) -> tuple[int, ...]:
        """The ids after the hash blocks (drawn at once, as one request's own stream)."""
        if self._tail is None:
            n = self.length - len(self.hash_ids) * MOONCAKE_BLOCK_TOKENS
            rng = np.random.default_rng([HASH_BLOCK_SEED, UNIQUE_TAIL_STREAM, self.request_id])
            self._tail = tuple(rng.integers(0, TRACE_VOCAB, n).tolist()) if n > 0 else ()
        return self._tail

    @overload
    def __getitem__(self, k: int) -> int: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[int, ...]: ...

    def __getitem__(self, k: int | slice) -> int | tuple[int, ...]:
        if not isinstance(k, slice):
            i = range(self.length)[k]  # IndexError past the end, as a tuple's
            return self[i:i + 1][0]
        start, stop, step = k.indices(self.length)
        if step != 1:
            return tuple(self)[k]
        bs = MOONCAKE_BLOCK_TOKENS
        covered = len(self.hash_ids) * bs
        out: list[int] = []
        while start < stop and start < covered:
            b, off = divmod(start, bs)
            end = min(stop, (b + 1) * bs)
            out += hash_block_ids(self.hash_ids[b])[off:off + end - start]
            start = end
        if start < stop:
            out += self.tail()[start - covered:stop - covered]
        return tuple(out)

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])


def expand_hash_ids(request_id: int, hash_ids: tuple[int, ...], prompt_len: int) -> tuple[int, ...]:
    """Prompt ids as one tuple (HashBlockIds made whole)."""
    return HashBlockIds(request_id, hash_ids, prompt_len)[:]
