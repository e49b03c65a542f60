"""Split-K decode launches that ``cbbench.kernels.aot``'s matrix leaves out, compiled the same way.

The matrix compiles the split kernel at block sizes 16 and 256; the CPU suite proves it at 16
and 32 (tests/kernels/test_kernels_split_k.py), and the block size is a compile-time constant,
so the 32-key block's compile is a different kernel. These points add it for every dtype, head
dim and GQA group, launched as a captured graph launches it (32 splits, max_seqlen_k = 8192).
Alone, in a process without TRITON_INTERPRET:

    python tests/kernels/aot_split_points.py --cap 90 --json OUT

tests/kernels/test_triton_aot.py runs the library's matrix (``cbbench.kernels.aot``'s main) and these
points in one process per architecture, which writes both files into a folder:

    python tests/kernels/aot_split_points.py --cap 90 --with-matrix DIR   (sm_90.json, extra_sm_90.json)

One process, not two: each pays ~4 CPU-s of torch and Triton imports before it compiles anything,
and these 18 launches cost well under that.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from cbbench.kernels import aot
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
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--json", help="where to write these points' rows")
    where.add_argument("--with-matrix", metavar="DIR",
                       help="first the library's matrix into DIR/sm_CAP.json, then these points "
                            "into DIR/extra_sm_CAP.json")  # fmt: skip
    args = parser.parse_args(argv)
    out = args.json
    if args.with_matrix is not None:
        matrix = os.path.join(args.with_matrix, f"sm_{args.cap}.json")
        status = aot.main(["--cap", str(args.cap), "--json", matrix])
        if status != 0:
            return status
        out = os.path.join(args.with_matrix, f"extra_sm_{args.cap}.json")
    rows = compile_launches(args.cap, split_points())
    with open(out, "w") as f:
        json.dump({"rows": [dataclasses.asdict(r) for r in rows]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
