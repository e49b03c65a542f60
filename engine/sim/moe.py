"""Mixture-of-experts arithmetic for the cost model: how many experts a batch touches, and
expert parallelism's all-to-all.

Routing is assumed uniform and independent: each token picks k distinct experts of E, every
expert equally likely, independently of the other tokens (a balanced router's ideal; a real
router is skewed, which touches fewer experts and loads some GPUs more). Then one expert is
missed by one token with probability 1 - k/E, by all B tokens with (1 - k/E)^B, and the
expected number of distinct experts a layer reads is

    E * (1 - (1 - k/E)^B)

which is k at B = 1 and tends to E as the batch grows: a large batch reads every expert's
weights once per step, like a dense model of the total size, while its FLOPs stay those of
the k active experts.
"""

from __future__ import annotations

import math


def expected_experts_touched(num_experts: int, top_k: int, num_tokens: float) -> float:
    """Distinct experts hit by ``num_tokens`` tokens choosing ``top_k`` each, in expectation
    under uniform routing."""
    if num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def all_to_all_s(bandwidth: float, latency_s: float, bytes_per_gpu: float, n: int) -> float:
    """One all-to-all over ``n`` GPUs where each starts with ``bytes_per_gpu`` to scatter:
    (n-1)/n of it leaves the GPU, over its own link (bandwidth per direction per GPU)."""
    return latency_s + (n - 1) / n * bytes_per_gpu / bandwidth


# Beyond this many tokens the busiest GPU's expected load is its whole share to double
# precision (every expert touched with probability 1 - 1e-16 or more): no need to go on.
SATURATED = 1.0 - 1e-16


class BusiestGPU:
    """Expected distinct experts on the most-loaded GPU when ``num_experts`` experts spread
    whole over ``ep`` GPUs (E/ep each, a fixed partition) and T tokens route uniformly, k
    distinct experts each. Each MoE layer's all-to-all waits for that GPU, so a step's expert
    weights are its bytes, not the average over GPUs E/ep * (1 - (1 - k/E)^T): at batch 1 on
    Mixtral (8 experts, top 2) over 8 GPUs the average is 0.25 experts, the busiest GPU
    reads 1 whole expert per layer.

    Exact under uniform routing, in two steps:

    - N, the number of distinct experts the batch touches, is a Markov chain over the
      tokens: with n touched, a token's k picks add j new ones with probability
      C(E-n, j) C(n, k-j) / C(E, k) (hypergeometric).
    - Given N = m, the touched set is a uniform m-subset of the E experts (the experts are
      exchangeable), so the chance every GPU holds at most c of them is the count of
      m-subsets with at most c per GPU over C(E, m): the x^m coefficient of
      (sum_{s<=c} C(g, s) x^s)^ep over C(E, m), with g = E/ep.

    Then E[max] = sum_{c=0}^{g-1} P(max > c) = g - sum_m P(N = m) w_m with
    w_m = sum_{c<g} P(every GPU <= c | N = m). Values are cached per integer T (the chain is
    stepped once per token, as far as the largest T asked); a fractional T (an expected
    share) is interpolated between its neighbours."""

    def __init__(self, num_experts: int, top_k: int, ep: int) -> None:
        import numpy as np

        E, k = num_experts, top_k
        if ep < 1 or E % ep:
            raise ValueError(f"{E} experts do not spread evenly over {ep} GPUs")
        g = E // ep
        self.per_gpu = g
        step = np.zeros((E + 1, E + 1))
        total = math.comb(E, k)
        for n in range(E + 1):
            for j in range(0, min(k, E - n) + 1):
                if k - j <= n:
                    step[n, n + j] = math.comb(E - n, j) * math.comb(n, k - j) / total
        self._step = step
        w = np.zeros(E + 1)
        for c in range(g):
            poly = [1]
            part = [math.comb(g, s) for s in range(c + 1)]
            for _ in range(ep):
                poly = _poly_mul(poly, part)
            for m in range(min(len(poly), E + 1)):
                w[m] += poly[m] / math.comb(E, m)
        self._w = w
        self._dist = np.zeros(E + 1)
        self._dist[0] = 1.0
        self._values = [float(g - self._dist @ w)]  # T = 0: nothing touched, E[max] = 0
        self._saturated = False

    def _value(self, t: int) -> float:
        values = self._values
        while len(values) <= t and not self._saturated:
            self._dist = self._dist @ self._step
            values.append(float(self.per_gpu - self._dist @ self._w))
            self._saturated = self._dist[-1] >= SATURATED
        return values[t] if t < len(values) else float(self.per_gpu)

    def expected_max(self, num_tokens: float) -> float:
        """E[distinct experts on the busiest GPU] for ``num_tokens`` tokens."""
        if num_tokens <= 0:
            return 0.0
        lo = math.floor(num_tokens)
        frac = num_tokens - lo
        low = self._value(lo)
        return low if frac == 0 else low + frac * (self._value(lo + 1) - low)


def _poly_mul(a: list[int], b: list[int]) -> list[int]:
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out
