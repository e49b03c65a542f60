"""Prometheus metrics for `cbbench serve`, on a registry of the app's own (so two apps in one
process, as in the tests, never collide on the global registry).

Gauges are read from the engine snapshot at scrape time; histograms and counters are fed by the
engine thread through the bridge's observer hooks (prometheus-client metrics are thread-safe).
``cbbench_kv_cache_usage_perc`` is a fraction in [0, 1], as vLLM's metric of that name.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from cbbench.server.async_engine import EngineSnapshot

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFILL_TOKEN_BUCKETS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DECODE_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge("cbbench_num_requests_running", "Requests running in the engine.", registry=r)
        self.waiting = Gauge("cbbench_num_requests_waiting", "Requests waiting to be scheduled.", registry=r)
        self.kv_usage = Gauge(
            "cbbench_kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1).", registry=r
        )
        self.kv_used = Gauge("cbbench_kv_cache_blocks_used", "KV-cache blocks in use.", registry=r)
        self.kv_total = Gauge("cbbench_kv_cache_blocks_total", "KV-cache blocks in the pool.", registry=r)
        self.prefill_tokens = Histogram(
            "cbbench_iteration_prefill_tokens", "Prefill tokens per engine iteration.",
            buckets=PREFILL_TOKEN_BUCKETS, registry=r,
        )
        self.decode_tokens = Histogram(
            "cbbench_iteration_decode_tokens", "Decode tokens per engine iteration.",
            buckets=DECODE_TOKEN_BUCKETS, registry=r,
        )
        self.duration = Histogram(
            "cbbench_iteration_duration_seconds", "Engine iteration duration.",
            buckets=DURATION_BUCKETS, registry=r,
        )
        # prometheus-client appends _total to counter names.
        self.finished = Counter("cbbench_requests_finished", "Requests that finished.", registry=r)
        self.aborted = Counter(
            "cbbench_requests_aborted", "Requests aborted (client went away).", registry=r
        )
        self.rejected = Counter(
            "cbbench_requests_rejected", "Requests the engine could never fit.", registry=r
        )
        self.prompt_tokens = Counter(
            "cbbench_prompt_tokens", "Prompt tokens of admitted requests.", registry=r
        )
        self.generation_tokens = Counter(
            "cbbench_generation_tokens", "Output tokens generated.", registry=r
        )

    # ---- EngineObserver: called from the engine thread -----------------------------------------
    def on_admitted(self, req) -> None:
        self.prompt_tokens.inc(req.num_prompt_tokens)

    def on_rejected(self, req) -> None:
        self.rejected.inc()

    def on_aborted(self, req) -> None:
        self.aborted.inc()

    def on_step(self, out, num_new_tokens: int) -> None:
        rec = out.record
        self.prefill_tokens.observe(rec.num_prefill_tokens)
        self.decode_tokens.observe(rec.num_decode_tokens)
        self.duration.observe(rec.duration_s)
        if out.finished:
            self.finished.inc(len(out.finished))
        if num_new_tokens:
            self.generation_tokens.inc(num_new_tokens)

    # ---- scrape ----------------------------------------------------------------------------------
    def render(self, snap: EngineSnapshot) -> bytes:
        self.running.set(snap.running)
        self.waiting.set(snap.waiting)
        self.kv_used.set(snap.kv_blocks_used)
        self.kv_total.set(snap.kv_blocks_total)
        self.kv_usage.set(snap.kv_usage)
        return generate_latest(self.registry)
