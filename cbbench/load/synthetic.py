"""``--workload random``: synthetic lengths with vLLM's random-dataset semantics.

Each request's input length is drawn uniformly from the integers in
[floor(L_in * (1 - r)), ceil(L_in * (1 + r))] and its output length from
[max(1, floor(L_out * (1 - r))), ceil(L_out * (1 + r))], with r = --length-range in [0, 1)
(r = 0: every request has exactly the given lengths). Lengths count every token the server
sees, special tokens included, as the sharegpt set does.

``--prefix-len P`` puts the same P tokens in front of every prompt (a shared system prompt):
prompt_len = P + the drawn input length. Such requests carry explicit token ids (the shared
prefix, then ids of their own) so a prefix cache can find the sharing; without a prefix they
are length-only, like sharegpt.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from cbbench.errors import UsageError
from cbbench.load.limits import check_token_ids
from cbbench.load.workload_types import Workload, WorkloadRequest

RANDOM_WORKLOAD = "random"
# vLLM's `bench serve --dataset-name random` defaults.
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128
DEFAULT_LENGTH_RANGE = 0.0
DEFAULT_PREFIX_LEN = 0
# Ids below 512 are valid for every model preset, the tiny test ones included.
RANDOM_VOCAB = 512
# Separate random streams, so the lengths do not change with --prefix-len.
LENGTH_STREAM = 11
PREFIX_STREAM = 12
TOKEN_STREAM = 13
BOUND_DIGITS = 9

# The longest length a draw can hold: twice it (the top of a length range) fits in int64.
MAX_LEN = 2**62 - 1


@dataclass(frozen=True)
class RandomSpec:
    input_len: int = DEFAULT_INPUT_LEN
    output_len: int = DEFAULT_OUTPUT_LEN
    length_range: float = DEFAULT_LENGTH_RANGE
    prefix_len: int = DEFAULT_PREFIX_LEN

    def validate(self) -> RandomSpec:
        # Lengths are drawn as int64 within [len * (1 - R), len * (1 + R)]: beyond MAX_LEN
        # numpy raised (`--input-len 2**63` was a traceback). Messages as --seed's range.
        for flag, v, low in (("--input-len", self.input_len, 1),
                             ("--output-len", self.output_len, 1),
                             ("--prefix-len", self.prefix_len, 0)):
            if not low <= v <= MAX_LEN:
                raise UsageError(f"{flag} must be in [{low}, {MAX_LEN}], got {v}")
        if not (0.0 <= self.length_range < 1.0):
            raise UsageError(f"--length-range must be in [0, 1), got {self.length_range}")
        return self

    def input_bounds(self) -> tuple[int, int]:
        return _bounds(self.input_len, self.length_range)

    def output_bounds(self) -> tuple[int, int]:
        return _bounds(self.output_len, self.length_range)

    def to_config(self) -> dict:
        return asdict(self)


def _bounds(length: int, r: float) -> tuple[int, int]:
    """[floor(len * (1 - r)), ceil(len * (1 + r))], at least 1. The products are rounded
    first so float noise cannot widen the interval (200 * 1.1 is 220.00000000000003)."""
    low = max(1, math.floor(round(length * (1 - r), BOUND_DIGITS)))
    return low, max(low, math.ceil(round(length * (1 + r), BOUND_DIGITS)))


def random_workload(spec: RandomSpec, num_requests: int, seed: int) -> Workload:
    spec.validate()
    rng = np.random.default_rng([seed, LENGTH_STREAM])
    in_lo, in_hi = spec.input_bounds()
    out_lo, out_hi = spec.output_bounds()
    if spec.prefix_len:  # every prompt's ids are made: check what they take first
        check_token_ids(num_requests * (spec.prefix_len + in_hi),
                        f"--workload random with --prefix-len {spec.prefix_len} and "
                        f"--input-len {spec.input_len} ({num_requests} prompts)")
    inputs = rng.integers(in_lo, in_hi + 1, num_requests)
    outputs = rng.integers(out_lo, out_hi + 1, num_requests)
    prefix: list[int] = []
    if spec.prefix_len:
        prefix = np.random.default_rng([seed, PREFIX_STREAM]).integers(
            0, RANDOM_VOCAB, spec.prefix_len
        ).tolist()
    reqs = []
    for i, (n_in, n_out) in enumerate(zip(inputs.tolist(), outputs.tolist())):
        ids = None
        if prefix:
            own = np.random.default_rng([seed, TOKEN_STREAM, i]).integers(0, RANDOM_VOCAB, n_in)
            ids = tuple(prefix + own.tolist())
        reqs.append(WorkloadRequest(i, spec.prefix_len + n_in, n_out, prompt_token_ids=ids))
    shared = f", a shared {spec.prefix_len}-token prefix" if spec.prefix_len else ""
    return Workload(
        RANDOM_WORKLOAD,
        reqs,
        f"random lengths: input {in_lo}-{in_hi}, output {out_lo}-{out_hi}{shared}",
    )
