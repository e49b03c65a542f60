"""Issue 39 item 1: an ANALYTIC ESTIMATE (not a measurement) of the split-K decode attention's
latency chain for one Llama-3-8B layer on an H100, before and after the split layout change.

    python results/decode_chain_estimate.py > results/decode_chain_estimate.md

The program layout (splits, programs holding keys, iterations per program) is computed from the
library's own functions (``num_kv_splits``, ``split_bounds``, the GPU tiles) and, for "before",
from the rule the kernel had at 5026e70 (each split's ``ceil(seq_len / splits)`` keys rounded up
to whole 64-key tiles, 64-key iterations). The microseconds come from a chain model whose
constants are ASSUMPTIONS, named below; no GPU was used.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # nothing launches; the import needs no GPU

from cbbench.kernels.triton_attention import GPU_TILES  # noqa: E402
from cbbench.kernels.triton_decode_split import num_kv_splits, split_bounds  # noqa: E402

SMS = 132  # H100 SXM
KV_HEADS, HEAD_DIM, BYTES = 8, 128, 2  # Llama-3-8B, bf16
GRAPH_MAX_SEQLEN_K = 8192  # a captured graph's max_seqlen_k: the model's length
OLD_BLOCK_N = 64  # the split kernel's keys per iteration at 5026e70
# Chain-model ASSUMPTIONS (H100, order of magnitude; a GPU run must replace them):
MEM_ROUND_TRIP_US = 0.7  # one dependent global load that misses L2 (HBM)
L2_ROUND_TRIP_US = 0.4  # the merge's loads of partials just written (L2 hits)
LAUNCH_GAP_US = 1.5  # a kernel node inside a CUDA graph: start + drain
SM_SHARE_GBPS = 3350 / SMS  # one SM's fair share of HBM bandwidth, GB/s (= KB/us)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def old_bounds(seq_len: int, splits: int) -> list[tuple[int, int]]:
    per = cdiv(cdiv(seq_len, splits), OLD_BLOCK_N) * OLD_BLOCK_N
    return [(s * per, min((s + 1) * per, seq_len)) for s in range(splits)]


def layout(batch: int, context: int, bounds, block_n: int) -> dict:
    seq_len = context + 1
    splits = num_kv_splits(batch, KV_HEADS, GRAPH_MAX_SEQLEN_K, SMS)
    ranges = [(a, b) for a, b in bounds(seq_len, splits) if a < b]
    keys = max(b - a for a, b in ranges)
    working = batch * KV_HEADS * len(ranges)
    per_sm = max(1.0, working / SMS)  # programs an SM runs (all resident: see the AOT rows)
    kib_per_sm = per_sm * keys * HEAD_DIM * BYTES * 2 / 1024  # K and V
    return {
        "splits": splits, "working": working, "launched": batch * KV_HEADS * splits,
        "iters": -(-keys // block_n), "keys": keys, "per_sm": per_sm, "kib_per_sm": kib_per_sm,
    }  # fmt: skip


def chain_us(lay: dict, round_trips_per_iter: float) -> float:
    """Split kernel: (lengths) -> per iteration ``round_trips_per_iter`` dependent HBM round
    trips, plus the SM's bytes at its share of bandwidth; then the merge kernel's launch and
    its L2 round trip."""
    split = LAUNCH_GAP_US + MEM_ROUND_TRIP_US + lay["iters"] * round_trips_per_iter * MEM_ROUND_TRIP_US
    split += lay["kib_per_sm"] * 1.024 / SM_SHARE_GBPS
    return split + LAUNCH_GAP_US + L2_ROUND_TRIP_US


def main() -> None:
    print("# Split-K decode attention, one Llama-3-8B layer on an H100: ESTIMATE, not measured\n")
    print("Made by `python results/decode_chain_estimate.py` (no GPU). Layout columns are exact")
    print("(the library's split rule, a captured graph's split count from max_seqlen_k = 8192);")
    print(f"microseconds come from a chain model with ASSUMED constants: HBM round trip "
          f"{MEM_ROUND_TRIP_US} us, L2 round trip {L2_ROUND_TRIP_US} us, graph kernel node "
          f"{LAUNCH_GAP_US} us, an SM's share of bandwidth {SM_SHARE_GBPS:.1f} GB/s. Before = "
          f"5026e70 (splits rounded to 64-key tiles, 64-key iterations, V loaded after the "
          f"scores: 2 or 3 dependent HBM round trips an iteration, block table -> K -> V, as "
          f"Triton's pipeliner did or did not hoist V); after = this tree "
          f"({GPU_TILES.block_n_split}-key iterations, V beside K: 2, block table -> K and V). "
          f"The model adds round trips to transfer time and ignores software pipelining, "
          f"so where iterations > 1 it is an upper bound; at batch 16 the transfer term (the "
          f"bandwidth floor) dominates. Programs / SM assumes every program resident at "
          f"once: the split kernel at head dim 128 and 16-bit compiles to 185 registers a "
          f"thread under Triton 3.6 for sm_90 (2 blocks of 4 warps an SM; 165 under 3.9: 3) "
          f"against 92 before (5), so batch 1's 256 programs fit one round of 264 but batch "
          f"16's 384 take two under 3.6, which the model leaves out.\n")  # fmt: skip
    print("| batch | context | splits | programs with keys (of launched) before -> after "
          "| keys / program | iterations / program | programs / SM | est. us before -> after |")
    print("|---|---|---|---|---|---|---|---|")
    for batch, context in [(1, 512), (1, 2048), (1, 8192), (16, 512), (16, 8192)]:
        old = layout(batch, context, old_bounds, OLD_BLOCK_N)
        new = layout(batch, context, split_bounds, GPU_TILES.block_n_split)
        print(
            f"| {batch} | {context} | {new['splits']} | {old['working']} -> {new['working']} "
            f"(of {new['launched']}) | {old['keys']} -> {new['keys']} | {old['iters']} -> "
            f"{new['iters']} | {old['per_sm']:.2f} -> {new['per_sm']:.2f} | "
            f"{chain_us(old, 2):.1f}-{chain_us(old, 3):.1f} -> {chain_us(new, 2):.1f} |"
        )
    unsplit = {"iters": -(-513 // OLD_BLOCK_N), "kib_per_sm": 513 * HEAD_DIM * BYTES * 2 / 1024}
    print(f"\nFor scale, batch 1 at context 512 unsplit (8 programs, the packed kernel the H100 "
          f"run timed eagerly at 45 us, ~40 us of it host launch overhead): "
          f"{chain_us(unsplit, 2) - LAUNCH_GAP_US - L2_ROUND_TRIP_US:.1f}-"
          f"{chain_us(unsplit, 3) - LAUNCH_GAP_US - L2_ROUND_TRIP_US:.1f} us by the same model "
          f"(one launch, no merge). What is left at batch 1 is two graph nodes "
          f"(~{2 * LAUNCH_GAP_US} us assumed) and 3 dependent HBM round trips (lengths, block "
          f"table, K and V): merging the splits inside the first launch (the last split of a "
          f"kv head merges) would remove one node; not built.")  # fmt: skip


if __name__ == "__main__":
    main()
