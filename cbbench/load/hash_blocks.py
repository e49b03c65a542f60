"""Mooncake's hash blocks as token ids: each hash id names one 512-token block of a prompt, and
always gives the same ids, so the engine's prefix cache sees a trace's real sharing."""

from __future__ import annotations

import functools

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512
# Block contents: ids below 512 are valid for every model preset, the tiny test ones included.
TRACE_VOCAB = 512
HASH_BLOCK_SEED = 20250225  # FAST'25: fixed, so a hash id means the same block on every run
UNIQUE_TAIL_STREAM = 1


@functools.lru_cache(maxsize=1 << 14)
def hash_block_ids(hash_id: int) -> tuple[int, ...]:
    """The 512 token ids of one hash block: the same on every run."""
    rng = np.random.default_rng([HASH_BLOCK_SEED, hash_id])
    return tuple(rng.integers(0, TRACE_VOCAB, MOONCAKE_BLOCK_TOKENS).tolist())


def expand_hash_ids(request_id: int, hash_ids: tuple[int, ...], prompt_len: int) -> tuple[int, ...]:
    """Prompt ids: the hash blocks in order (the last one cut to the prompt's length), then,
    where the trace names fewer blocks than the prompt fills, ids of this request alone."""
    ids: list[int] = []
    for h in hash_ids:
        ids += hash_block_ids(h)
    if len(ids) < prompt_len:
        rng = np.random.default_rng([HASH_BLOCK_SEED, UNIQUE_TAIL_STREAM, request_id])
        ids += rng.integers(0, TRACE_VOCAB, prompt_len - len(ids)).tolist()
    return tuple(ids[:prompt_len])
