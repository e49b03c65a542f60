"""The roofline floor of one forward step of a dense model at an exact shape: each operator's
FLOPs and bytes, and the time no kernel can beat at a GPU's peak bandwidth and peak FLOP/s.

A step is a list of rows ``(new_tokens, context)``: a decode row is ``(1, C)`` (one new token
attending C cached keys and itself), a prefill chunk ``(T, C)`` (T new tokens after C cached
ones). The kernels run one after another, so the floor is the sum over operators of
max(bytes / peak bandwidth, FLOPs / peak FLOP/s): at decode batch 1 every operator is
bandwidth-bound; at batch 256 or a 2048-token chunk the GEMMs are compute-bound.

Operators (L layers, h hidden, N = the step's new tokens, R = its rows, db = dtype bytes):

- ``layer GEMMs``: QKV, O and the SwiGLU MLP, 2 N x (their weights) FLOPs; their weights read;
- ``norms and biases``: the rest of each layer's weights (and the final norm), read, no FLOPs
  counted;
- ``lm_head``: one sampled row per request, 2 R x vocab x h FLOPs; the head read (the embedding
  table itself when tied);
- ``attention``: 4 x q_size x keys x L FLOPs (QK^T and PV), keys = each new token's causal
  span (a decode row: C + 1; a chunk: T C + T (T + 1) / 2); bytes: every row's C + T keys' K and
  V (the cached ones read, the new ones written);
- ``embedding rows``: the N rows the step gathers (an untied table is read only there:
  Llama-3-8B bf16 reads 15.01 of its 16.06 GB at batch 1; a tied one is read twice, its rows
  at the first layer and whole again as the LM head at the last, too far apart for a cache).

Dense models only: an MoE step's bytes depend on which experts the batch routes to.
Moved here from tests/gpu/gpu_check_decode.py (decode_operators), which it generalizes: a
decode step's numbers are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MS = 1000.0

Row = tuple[int, int]  # (new tokens, cached context before them)


@dataclass(frozen=True)
class Operator:
    name: str
    flops: float
    bytes: int

    def floor_s(self, peak_bw: float, peak_flops: float) -> float:
        return max(self.bytes / peak_bw, self.flops / peak_flops)

    def bound(self, peak_bw: float, peak_flops: float) -> str:
        """Which roof limits it: "memory" or "compute"."""
        return "compute" if self.flops / peak_flops > self.bytes / peak_bw else "memory"


def decode_rows(batch: int, context: int) -> list[Row]:
    return [(1, context)] * batch


def prefill_rows(tokens: int, context: int = 0) -> list[Row]:
    return [(tokens, context)]


def step_operators(config, dtype: str, rows: Sequence[Row]) -> list[Operator]:
    """Each operator of one step over ``rows`` (see the module's list)."""
    if getattr(config, "is_moe", False):
        raise ValueError(f"{config.name}: the roofline here covers dense models only")
    db = DTYPE_BYTES[dtype]
    h, L = config.hidden_size, config.num_layers
    n = sum(t for t, _ in rows)
    gemm = (h * (config.q_size + 2 * config.kv_size) + config.q_size * h
            + 3 * h * config.intermediate_size)
    head = config.vocab_size * h  # the LM head (the embedding table itself when tied)
    keys = sum(t * c + t * (t + 1) // 2 for t, c in rows)
    kv_tokens = sum(t + c for t, c in rows)
    return [
        Operator("layer GEMMs", 2.0 * n * gemm * L, gemm * L * db),
        Operator("norms and biases", 0.0, ((config.params_per_layer - gemm) * L + h) * db),
        Operator("lm_head", 2.0 * len(rows) * head, head * db),
        Operator("attention", 4.0 * config.q_size * keys * L,
                 kv_tokens * config.kv_bytes_per_token(dtype)),
        Operator("embedding rows", 0.0, n * h * db),
    ]


@dataclass(frozen=True)
class Floor:
    """A step's floor and both of its terms, in ms: ``bytes_ms`` (every byte at peak
    bandwidth), ``flops_ms`` (every FLOP at peak compute), ``floor_ms`` (the sum over operators
    of the larger of the two)."""

    floor_ms: float
    bytes_ms: float
    flops_ms: float
    bytes: int
    flops: float


def step_floor(ops: Sequence[Operator], peak_bw: float, peak_flops: float) -> Floor:
    total_bytes = sum(o.bytes for o in ops)
    total_flops = sum(o.flops for o in ops)
    return Floor(
        floor_ms=sum(o.floor_s(peak_bw, peak_flops) for o in ops) * MS,
        bytes_ms=total_bytes / peak_bw * MS,
        flops_ms=total_flops / peak_flops * MS,
        bytes=total_bytes,
        flops=total_flops,
    )


def operator_table(ops: Sequence[Operator], peak_bw: float, peak_flops: float) -> list[dict]:
    """The per-operator rows of a step: FLOPs, bytes, floor and which roof binds."""
    return [{"name": o.name, "flops": o.flops, "bytes": o.bytes,
             "floor_ms": o.floor_s(peak_bw, peak_flops) * MS,
             "bound": o.bound(peak_bw, peak_flops)} for o in ops]
