"""CostModel.cost for a dense model, as one flat function of the batch's counts.

The array simulator (array_sim.py) prices millions of steps; CostModel.cost builds a BatchShape,
nine operator tuples and an IterationCost per step (~7 us). This computes the same three
numbers (predicted time, analytic bytes, analytic FLOPs) from the same counts, bit for bit:

- every FLOP and byte count of a dense model is an integer below 2**53 (token counts times
  integer widths; attention's key pairs n*c + n(n+1)/2 are integers), so each is exact in a
  float however it is grouped: the per-operator weights and widths are folded into constants
  once here;
- the time is the same sum, in the same operator order, of the same max(flops / rate,
  bytes / bandwidth) per operator, then the same overheads in the same order.

Only where those hold: a dense model on one GPU or with tensor parallelism, on a device with
both rates, decode and prefill attention at one efficiency. Elsewhere ``dense_cost`` returns
None and the caller prices each step with CostModel.cost. tests/engine/test_array_sim.py
compares the two on random batches.
"""

from __future__ import annotations

from collections.abc import Callable

from .cost_model import (
    ELEMENTWISE_PASSES_PER_LAYER,
    LOGITS_BYTES,
    BatchShape,
    CostModel,
)

# (time_s, bytes, flops) of a step from (tokens, logits, key pairs, keys read, requests,
# prefill requests, decode keys)
StepCost = Callable[[int, int, float, float, int, int, float], tuple[float, float, float]]


def dense_cost(cm: CostModel) -> StepCost | None:
    r = cm.rates
    if (cm.model.is_moe or cm.ep != 1 or r is None or not r.flop_rate or not r.memory_bandwidth
            or r.decode_attention_efficiency != r.prefill_attention_efficiency):
        return None
    fl, bw = r.flop_rate, r.memory_bandwidth
    eff = r.decode_attention_efficiency
    db, L, h = cm.dtype_bytes, cm._L, cm.model.hidden_size
    # Per GEMM: FLOPs per token, bytes of the weights, bytes per token (exact integers).
    gemms = [(2 * params * L, params * db * L, (din + dout) * db * L)
             for params, din, dout in cm._layer_gemms]
    (f0, w0, a0), (f1, w1, a1), (f2, w2, a2), (f3, w3, a3) = (
        (float(f), float(w), float(a)) for f, w, a in gemms)
    afp = float(cm._attn_flops_per_pair)
    kvb = float(cm._kv_bytes_per_token)
    qo = float(2 * cm._q_size * db * L)  # attention's q read and o written, per token
    elem = float(ELEMENTWISE_PASSES_PER_LAYER * h * db * L)
    emb = float(h * db)
    vh = cm._vocab * h
    head_f = float(2 * vh)
    head_w = float(vh * db)
    head_a = float(cm._vocab * LOGITS_BYTES)
    overhead, row, pre, host = (r.iteration_overhead_s, r.row_overhead_s, r.prefill_overhead_s,
                                r.host_factor)
    comm = cm.communication_s if cm.interconnect is not None else None

    def cost(tokens: int, logits: int, pairs: float, keys_read: float, reqs: int,
             prefill_reqs: int, decode_keys: float) -> tuple[float, float, float]:
        T = float(tokens)
        f_0, f_1, f_2, f_3 = f0 * T, f1 * T, f2 * T, f3 * T
        b_0, b_1, b_2, b_3 = w0 + a0 * T, w1 + a1 * T, w2 + a2 * T, w3 + a3 * T
        f_att = afp * pairs
        b_att = keys_read * kvb + qo * T
        b_kv = T * kvb
        b_elem = elem * T
        b_emb = emb * T
        f_head = head_f * logits
        b_head = head_w + head_a * logits
        # The roofline per operator, in CostModel.operators()'s order (max() inlined: a
        # conditional is a third of its cost; the KV write, elementwise and embedding
        # operators have no FLOPs).
        x, y = f_0 / fl, b_0 / bw
        t = x if x >= y else y
        x, y = f_1 / fl, b_1 / bw
        t += x if x >= y else y
        x, y = f_2 / fl, b_2 / bw
        t += x if x >= y else y
        x, y = f_3 / fl, b_3 / bw
        t += x if x >= y else y
        x, y = f_att / fl, b_att / bw
        t += (x if x >= y else y) / eff
        t += b_kv / bw
        t += b_elem / bw
        t += b_emb / bw
        x, y = f_head / fl, b_head / bw
        t += x if x >= y else y
        t += overhead
        if row:
            t += row * reqs
        if pre:
            t += pre * prefill_reqs
        if comm is not None:
            t += comm(BatchShape(tokens, logits, pairs, keys_read, reqs, prefill_reqs,
                                 decode_keys))
        if host != 1.0:
            t *= host
        nbytes = b_0 + b_1 + b_2 + b_3 + b_att + b_kv + b_elem + b_emb + b_head
        flops = f_0 + f_1 + f_2 + f_3 + f_att + f_head
        return t, nbytes, flops

    return cost
