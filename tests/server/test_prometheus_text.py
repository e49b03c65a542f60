"""`cbbench serve`'s /metrics text, byte for byte where vLLM's is fixed by prometheus-client
(the library vLLM exposes its metrics with): the same series written by prometheus-client's
own Histogram is the truth, and prometheus-client's parser reads ours."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cbbench.server.engine_events import EngineSnapshot
from cbbench.server.prometheus import ServerMetrics, build_1_2_5_buckets

LONG_CONTEXT = 1_048_576  # a 1M-token model: its 1-2-5 buckets reach 1,000,000


def _le_labels(text: str, family: str) -> list[str]:
    return [s.labels["le"] for f in text_string_to_metric_families(text) if f.name == family
            for s in f.samples if s.name == f"{family}_bucket"]


def test_bucket_bounds_are_written_as_vllm_writes_them():
    """le="1e+06", as prometheus-client (and so vLLM) writes a bound of a million: a PromQL
    selector or a recording rule written against vLLM's /metrics matches ours."""
    buckets = build_1_2_5_buckets(LONG_CONTEXT)
    ref = CollectorRegistry()
    Histogram("vllm:request_prompt_tokens", "doc", buckets=buckets, registry=ref)
    want = _le_labels(generate_latest(ref).decode(), "vllm:request_prompt_tokens")
    assert "1e+06" in want

    metrics = ServerMetrics("m")
    metrics.on_ready({"max_model_len": LONG_CONTEXT})
    text = metrics.render(EngineSnapshot(ready=True)).decode()
    assert _le_labels(text, "vllm:request_prompt_tokens") == want
