"""Split-K decode launches that ``cbbench.kernels.aot``'s matrix leaves out, compiled the same way.

The matrix compiles the split kernel at block sizes 16 and 256; the CPU suite proves it at 16
and 32 (tests/kernels/test_kernels_split_k.py), and the block size is a compile-time constant,
so the 32-key block's compile is a different kernel. These points add it for every dtype, head
dim and GQA group, launched as a captured graph launches it (32 splits, max_seqlen_k = 8192).
tests/kernels/test_triton_aot.py runs this file beside the matrix, in a process without
TRITON_INTERPRET:

    python tests/kernels/aot_split_points.py --cap 90 --json OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from cbbench.kernels.aot import DTYPES, GQA_GROUPS, HEAD_DIMS, NUM_KV_HEADS, compile_launches

BLOCK_SIZE = 32
GRAPH_SPLITS = 32  # batch 1-2 on an H100 inside a graph (test_kernels_split_k.GRAPH_SPLITS)
GRAPH_MAX_SEQLEN_K = 8192


def split_points() -> Iterator[tuple[str, Callable[[], Any]]]:
    from cbbench.kernels import build_metadata
    from cbbench.kernels.triton_attention import TritonBackend

    backend = TritonBackend(decode_splits=GRAPH_SPLITS)
    md = build_metadata([1, 1], [5, 40], [[0], [1, 0]], BLOCK_SIZE)
    md = dataclasses.replace(md, max_seqlen_k=GRAPH_MAX_SEQLEN_K)
    for dname, head_dim, gqa in itertools.product(DTYPES, HEAD_DIMS, GQA_GROUPS):
        dtype = DTYPES[dname]
        cache = torch.zeros(2, BLOCK_SIZE, NUM_KV_HEADS, head_dim, dtype=dtype)
        q = torch.zeros(md.num_tokens, NUM_KV_HEADS * gqa, head_dim, dtype=dtype)
        yield (
            f"{dname} d{head_dim} gqa{gqa} bs{BLOCK_SIZE} split-k graph",
            partial(backend.forward, q, cache, cache, md, 0.1),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cap", type=int, required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    rows = compile_launches(args.cap, split_points())
    with open(args.json, "w") as f:
        json.dump({"rows": [dataclasses.asdict(r) for r in rows]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
