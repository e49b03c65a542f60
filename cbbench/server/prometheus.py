"""Prometheus metrics for `cbbench serve`, on a registry of the app's own (so two apps in one
process, as in the tests, never collide on the global registry).

Two families, side by side:

- ``vllm:*``: vLLM's own names, buckets and labels (``model_name``, ``engine="0"``), so
  dashboards and scrapers built for vLLM read `cbbench serve` unchanged: request latencies
  (TTFT, inter-token latency, per-request TPOT, e2e, queue, prefill, decode, inference), token
  counters and per-request token histograms, prefix-cache queries and hits, preemptions, and
  the scheduler gauges. As in vLLM, latencies count from a request's arrival at the engine
  (here: when the HTTP layer hands it over), so parsing before and socket writes after are
  outside them; the request log has both.
  The queue time, as vLLM's, starts when the scheduler takes the request in (the log's
  ``admitted``): the wait for the step in flight when it came is not queueing.
  ``vllm:time_per_output_token_seconds`` is vLLM's older name for the inter-token latency
  (observed once per engine output after a request's first, as vLLM: a step that accepted
  speculative drafts is one gap); the per-request TPOT is
  ``vllm:request_time_per_output_token_seconds``.
- ``cbbench_*``: the engine's per-iteration story (batch composition, iteration time, KV use).

The engine thread feeds both through the bridge's observer hooks, once per step. The vLLM
histograms are plain bucket counts under one lock, taken once per step: prometheus-client's
Histogram locks and scans its buckets on every observation, which at a few thousand tokens per
second is engine-thread time taken from the GIL the event loop needs.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter as Tally
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from cbbench.server.engine_events import EngineSnapshot, StepStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFILL_TOKEN_BUCKETS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DECODE_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)

# ---- vLLM's buckets (vllm/v1/metrics/loggers.py) -----------------------------------------------
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
VLLM_LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"  # one engine per server
# vLLM's finish reasons (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS), each a
# request_success series from the start, as vLLM creates them ("abort": a request the engine
# itself finished so; a client's abort is no success, as in vLLM; "error": a request the engine
# failed while serving on; "repetition": vLLM's repetition detection, which cbbench lacks: 0).
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
ERROR = "error"


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class BucketHistogram:
    """Bucket counts of one unlabelled series; observe(value, times) adds ``times`` equal
    observations at once. Not locked: the owner serializes writers and readers."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times  # le is inclusive
        self.sum += value * times
        self.count += times

    def family(self, name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=list(VLLM_LABELS))
        buckets, total = [], 0
        for bound, c in zip(self.bounds, self.counts):
            total += c
            buckets.append((_le(bound), total))
        buckets.append(("+Inf", self.count))
        fam.add_metric(labels, buckets, self.sum)
        return fam


def _le(bound: float) -> str:
    # prometheus-client's own text for a bound (vLLM's: "1e+06", where repr gave "1000000.0")
    return floatToGoString(bound)


@dataclass(frozen=True)
class Series:
    """One vLLM series: its name, help text and (a histogram's) buckets."""

    name: str
    doc: str
    buckets: tuple[float, ...] = ()


# The latency histograms, in seconds, and the per-step token histogram.
TTFT = Series("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              TTFT_BUCKETS)
ITL = Series("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
             ITL_BUCKETS)
ITL_OLD_NAME = Series(
    "vllm:time_per_output_token_seconds",
    "Histogram of time per output token in seconds (vLLM's older name for the inter-token "
    "latency).",
    ITL_BUCKETS,
)
REQUEST_TPOT = Series("vllm:request_time_per_output_token_seconds",
                      "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
E2E = Series("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             REQUEST_LATENCY_BUCKETS)
QUEUE = Series("vllm:request_queue_time_seconds",
               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
INFERENCE = Series("vllm:request_inference_time_seconds",
                   "Histogram of time spent in RUNNING phase for request.",
                   REQUEST_LATENCY_BUCKETS)
PREFILL = Series("vllm:request_prefill_time_seconds",
                 "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
DECODE = Series("vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
ITERATION_TOKENS = Series("vllm:iteration_tokens_total",
                          "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS)
# Token-count histograms: 1-2-5 buckets up to the model's context, known once the engine is up.
PROMPT_TOKENS_HIST = Series("vllm:request_prompt_tokens", "Number of prefill tokens processed.")
GENERATION_TOKENS_HIST = Series("vllm:request_generation_tokens",
                                "Number of generation tokens processed.")
MAX_TOKENS_HIST = Series("vllm:request_params_max_tokens",
                         "Histogram of the max_tokens request parameter.")
# Once per finished request, as vLLM's parallel_sampling.py observe_finished_request: its n
# (always 1: serve refuses n > 1) and the most tokens any of its n samples generated.
MAX_GENERATION_TOKENS_HIST = Series("vllm:request_max_num_generation_tokens",
                                    "Histogram of maximum number of requested generation tokens.")
PARAMS_N = Series("vllm:request_params_n", "Histogram of the n request parameter.",
                  PARAMS_N_BUCKETS)
NUM_PREEMPTIONS = Series("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
PROMPT_TOKENS = Series("vllm:prompt_tokens", "Number of prefill tokens processed.")
GENERATION_TOKENS = Series("vllm:generation_tokens", "Number of generation tokens processed.")
# vLLM's prefix-cache counters, on every server (0 without prefix caching): each new request's
# tokens when it looks the cache up, and the cached tokens it found (kv_cache_manager.py
# get_computed_blocks). A request resumed after a preemption is neither, as in vLLM. (vLLM
# counts a lookup again when the request then did not fit; here a request counts once, when
# it starts.)
PREFIX_CACHE_QUERIES = Series("vllm:prefix_cache_queries",
                              "Prefix cache queries, in terms of number of queried tokens.")
PREFIX_CACHE_HITS = Series("vllm:prefix_cache_hits",
                           "Prefix cache hits, in terms of number of cached tokens.")
# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py), registered only when
# speculation is on: a draft is one request's proposal in one step; its tokens, and how many of
# them the verify step accepted. (vLLM's per-position counter is not exported: the engine's
# iteration records hold the totals only.) In the order of on_step's ``spec``.
SPEC_COUNTERS = (
    Series("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    Series("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    Series("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
)
DEFAULT_MAX_MODEL_LEN = 8192  # for the token buckets when the engine does not say
LATENCY_SERIES = (TTFT, ITL, ITL_OLD_NAME, REQUEST_TPOT, E2E, QUEUE, INFERENCE, PREFILL, DECODE,
                  ITERATION_TOKENS)


class TokenHistograms:
    """The per-request token-count histograms, bucketed up to the model's context."""

    __slots__ = ("prompt", "generation", "max_tokens", "max_generation", "params_n")

    def __init__(self, buckets: tuple[int, ...]) -> None:
        self.prompt = BucketHistogram(buckets)
        self.generation = BucketHistogram(buckets)
        self.max_tokens = BucketHistogram(buckets)
        self.max_generation = BucketHistogram(buckets)
        self.params_n = BucketHistogram(PARAMS_N.buckets)

    def series(self) -> tuple[tuple[Series, BucketHistogram], ...]:
        return ((PROMPT_TOKENS_HIST, self.prompt), (GENERATION_TOKENS_HIST, self.generation),
                (MAX_TOKENS_HIST, self.max_tokens),
                (MAX_GENERATION_TOKENS_HIST, self.max_generation), (PARAMS_N, self.params_n))


class VllmMetrics:
    """The ``vllm:*`` series: a prometheus-client collector fed once per engine step."""

    def __init__(self, model_name: str | None = None) -> None:
        self._lock = threading.Lock()
        self.model_name = model_name
        # What a scrape shows, in this order; each also by name, for on_step.
        self.histograms: tuple[tuple[Series, BucketHistogram], ...] = tuple(
            (s, BucketHistogram(s.buckets)) for s in LATENCY_SERIES)
        (self.ttft, self.itl, self.itl_old_name, self.request_tpot, self.e2e, self.queue,
         self.inference, self.prefill, self.decode, self.iteration_tokens) = (
            h for _, h in self.histograms)
        self.tokens: TokenHistograms | None = None  # set when the engine is up
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)  # by vLLM's finished_reason label
        self.spec: list[int] | None = None  # SPEC_COUNTERS' counts, when the engine speculates
        self.snapshot: EngineSnapshot | None = None

    def on_ready(self, info: dict) -> None:
        if self.model_name is None:
            self.model_name = str(info.get("model", "model"))
        buckets = build_1_2_5_buckets(int(info.get("max_model_len") or DEFAULT_MAX_MODEL_LEN))
        with self._lock:
            self.tokens = TokenHistograms(buckets)
            if info.get("speculative_tokens"):
                self.spec = [0] * len(SPEC_COUNTERS)

    def on_step(self, num_tokens: int, num_preempted: int, stats: StepStats,
                spec: tuple[int, int, int] = (0, 0, 0), prefix: tuple[int, int] = (0, 0)) -> None:
        """``spec``: the step's (drafts, draft tokens, accepted tokens); ``prefix``: its
        prefix-cache (queried tokens, cached tokens)."""
        with self._lock:
            self.prefix_cache_queries += prefix[0]
            self.prefix_cache_hits += prefix[1]
            if self.spec is not None:
                self.spec = [total + n for total, n in zip(self.spec, spec)]
            self.num_preemptions += num_preempted
            self.prompt_tokens += stats.prompt_tokens
            self.generation_tokens += stats.new_tokens
            if num_tokens:  # vLLM observes only a step with outputs (not a prefill chunk's)
                self.iteration_tokens.observe(num_tokens)
            ttft = self.ttft
            for v in stats.ttfts_s:
                ttft.observe(v)
            if stats.itls_s:
                # Requests decoded in the same step mostly share one gap: observe each distinct
                # gap once, with its count.
                itl, itl_old_name = self.itl, self.itl_old_name
                for v, k in Tally(stats.itls_s).items():
                    itl.observe(v, k)
                    itl_old_name.observe(v, k)
            tok = self.tokens
            for f in stats.finished:
                self.success[f.finish_reason if f.finish_reason in self.success else "stop"] += 1
                self.e2e.observe(f.e2e_s)
                self.queue.observe(f.queue_s)
                self.prefill.observe(f.prefill_s)
                self.decode.observe(f.decode_s)
                self.inference.observe(f.inference_s)
                self.request_tpot.observe(f.mean_tpot_s)
                if tok is not None:
                    tok.prompt.observe(f.prompt_tokens)
                    tok.generation.observe(f.output_tokens)
                    tok.max_tokens.observe(f.max_tokens)
                    tok.max_generation.observe(f.output_tokens)  # n = 1: its own
                    tok.params_n.observe(1)

    def on_failed(self) -> None:
        with self._lock:
            self.success[ERROR] += 1

    def collect(self):
        labels = [self.model_name or "", ENGINE_INDEX]
        snap = self.snapshot
        if snap is not None:
            for name, doc, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.",
                 snap.running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                 snap.waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 snap.kv_usage),
            ):
                g = GaugeMetricFamily(name, doc, labels=list(VLLM_LABELS))
                g.add_metric(labels, value)
                yield g
        with self._lock:  # a consistent copy; rendering happens outside the lock
            series = self.histograms + (self.tokens.series() if self.tokens is not None else ())
            families = [h.family(s.name, s.doc, labels) for s, h in series]
            counters = [(NUM_PREEMPTIONS, self.num_preemptions),
                        (PROMPT_TOKENS, self.prompt_tokens),
                        (GENERATION_TOKENS, self.generation_tokens),
                        (PREFIX_CACHE_QUERIES, self.prefix_cache_queries),
                        (PREFIX_CACHE_HITS, self.prefix_cache_hits)]
            if self.spec is not None:
                counters += zip(SPEC_COUNTERS, self.spec)
            success = dict(self.success)
        for s, value in counters:
            fam = CounterMetricFamily(s.name, s.doc, labels=list(VLLM_LABELS))
            fam.add_metric(labels, value)
            yield fam
        fam = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.",
            labels=[*VLLM_LABELS, "finished_reason"],
        )
        for reason, value in success.items():
            fam.add_metric([*labels, reason], value)
        yield fam
        yield from families


class ServerMetrics:
    def __init__(self, model_name: str | None = None) -> None:
        r = self.registry = CollectorRegistry()
        self.vllm = VllmMetrics(model_name)
        r.register(self.vllm)
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
    def on_ready(self, info: dict) -> None:
        self.vllm.on_ready(info)

    def on_admitted(self, req) -> None:
        self.prompt_tokens.inc(req.num_prompt_tokens)

    def on_rejected(self, req) -> None:
        self.rejected.inc()

    def on_aborted(self, req) -> None:
        # Not a vLLM success: its client abort (OutputProcessor.abort_requests) drops the
        # request without finished-request stats, so request_success never counts it.
        self.aborted.inc()

    def on_failed(self, req) -> None:
        # vLLM's FinishReason.ERROR: a request-scoped failure (engine core's
        # _handle_request_preproc_error, a KV-load failure) finishes the request with "error",
        # answered 500, and request_success counts it.
        self.vllm.on_failed()

    def on_step(self, out, stats: StepStats) -> None:
        rec = out.record
        self.prefill_tokens.observe(rec.num_prefill_tokens)
        self.decode_tokens.observe(rec.num_decode_tokens)
        self.duration.observe(rec.duration_s)
        if out.finished:
            self.finished.inc(len(out.finished))
        if stats.new_tokens:
            self.generation_tokens.inc(stats.new_tokens)
        # vLLM's iteration tokens (loggers.py): the prompts of the requests that got their first
        # token plus the tokens generated, not the tokens scheduled (a prefill chunk without a
        # token yet, rejected drafts): the cbbench_iteration_* histograms have those.
        self.vllm.on_step(
            stats.prompt_tokens + stats.new_tokens, rec.num_preempted, stats,
            (rec.num_drafts, rec.draft_tokens, rec.accepted_tokens),
            (rec.num_prefix_queried_tokens, rec.num_cached_tokens),
        )

    # ---- scrape ----------------------------------------------------------------------------------
    def render(self, snap: EngineSnapshot) -> bytes:
        self.running.set(snap.running)
        self.waiting.set(snap.waiting)
        self.kv_used.set(snap.kv_blocks_used)
        self.kv_total.set(snap.kv_blocks_total)
        self.kv_usage.set(snap.kv_usage)
        self.vllm.snapshot = snap if snap.ready else None
        return generate_latest(self.registry)
