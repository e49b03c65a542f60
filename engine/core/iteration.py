"""One record per engine step: the engine's own story of each iteration."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class IterationRecord:
    index: int
    start_s: float
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    token_budget: int
    num_prefill_reqs: int
    num_decode_reqs: int
    num_running: int  # after the step's admissions, before its finishes
    num_waiting: int
    num_preempted: int  # preemptions this step
    kv_blocks_used: int
    kv_blocks_total: int
    bytes_moved: float  # analytic
    flops: float  # analytic
    num_swapped_out_blocks: int = 0  # swap preemption: KV blocks copied to the CPU pool
    num_swapped_in_blocks: int = 0  # ... and back
    swap_time_s: float = 0.0  # the copies' time (predicted by the simulator, measured by torch)
    num_cached_tokens: int = 0  # prefix-cache hits among the requests that started a prefill
    num_prefix_queried_tokens: int = 0  # those requests' tokens (the hit rate's denominator)
    # Both for requests resumed after a recompute preemption, which vLLM counts apart
    # (preempted_hits, preempted_queries) and out of the hit rate. In a record only where
    # one resumed (PREEMPTED_PREFIX_FIELDS), so results without one keep their keys.
    num_preempted_cached_tokens: int = 0
    num_preempted_queried_tokens: int = 0
    # The roofline's prediction of this step on the run's device (the simulator: its duration;
    # a real engine: the detected GPU's spec or a --gpu-profile; None when neither is known).
    predicted_s: float | None = None
    # The batch shape the cost model read (what cbbench calibrate refits the rates against).
    num_logits: int = 0  # rows that sample
    attn_key_pairs: float = 0.0  # sum over rows of keys attended
    attn_keys_read: float = 0.0  # keys read from the KV cache
    attn_decode_keys: float = 0.0  # of both, the decode rows' (one key pair per key read)
    # Speculative decoding (vLLM's spec_decode counters, per step): decodes that verified
    # drafts, their draft rows, the drafts accepted; and every engine's output tokens this
    # step and the requests that gained them (without speculation: one token each).
    num_drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    num_sampled_reqs: int = 0
    replica: int | None = None  # data parallelism: which engine replica ran it
    pool: str | None = None  # disaggregation: "prefill" or "decode" (replica: its index there)

    @property
    def achieved_bandwidth(self) -> float:
        return self.bytes_moved / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = {name: getattr(self, name) for name in FIELD_NAMES}
        if self.replica is None:
            del d["replica"]
        if self.pool is None:
            del d["pool"]
        if not self.num_preempted_queried_tokens:
            for name in PREEMPTED_PREFIX_FIELDS:
                del d[name]
        d["achieved_bw_gbps"] = self.achieved_bandwidth / 1e9
        return d


# Fields a record holds only where a request resumed after a preemption looked up the cache.
PREEMPTED_PREFIX_FIELDS = ("num_preempted_cached_tokens", "num_preempted_queried_tokens")
# Looked up once: to_dict runs for every record of a run (millions at scale).
FIELD_NAMES = tuple(f.name for f in fields(IterationRecord))
