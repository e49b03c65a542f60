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
