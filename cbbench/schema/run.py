"""The run result (`cbbench run`, each sweep and capacity probe, each compare variant): config,
summary, requests, iterations, telemetry. Field names are the file's; every field named here is
typed, the rest pass through (Record allows extra fields)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from cbbench.schema.base import Amount, Number, Record

RUN_SCHEMA_VERSION = 1


class Distribution(Record):
    """A latency distribution in ms (mean, std, pNN keys as extra fields, count)."""

    mean: Number | None = None
    std: Number | None = None
    count: int | None = None


class BreakdownPart(Distribution):
    """One part of the TTFT or E2EL breakdown: a distribution (ms) and its share of the whole."""

    share: Number | None = None


class Breakdown(Record):
    """summary.ttft_breakdown / e2el_breakdown (analysis/server_side/ttft_breakdown.py)."""

    requests: int
    flagged: int
    tolerance_ms: Number | None = None
    sources: list[str] | None = None
    slot_wait_ms: BreakdownPart | None = None
    send_lag_ms: BreakdownPart | None = None
    network_in_ms: BreakdownPart | None = None
    network_ms: BreakdownPart | None = None
    server_queue_ms: BreakdownPart | None = None
    server_prefill_ms: BreakdownPart | None = None
    server_decode_ms: BreakdownPart | None = None
    delivery_ms: BreakdownPart | None = None
    residual_ms: Distribution | None = None


class TimeSlice(Record):
    """One of summary.slices (analysis/summary/slices.py): [start_s, end_s) of the run clock."""

    start_s: Number
    end_s: Number
    completed: int
    failed: int | None = None
    cancelled: int | None = None
    error_types: dict[str, int] | None = None
    output_tokens: int | None = None
    request_throughput: Number | None = None
    output_throughput: Number | None = None
    ttft_ms: Distribution | None = None
    tpot_ms: Distribution | None = None
    itl_ms: Distribution | None = None
    e2el_ms: Distribution | None = None
    in_flight: Number | None = None
    in_flight_max: int | None = None


class RequestParts(Record):
    """A request's ttft_parts / e2el_parts (ms; None where unknown)."""

    source: str
    residual_ms: Number
    consistent: bool
    slot_wait_ms: Number | None = None
    send_lag_ms: Number | None = None
    network_in_ms: Number | None = None
    network_ms: Number | None = None
    server_queue_ms: Number | None = None
    server_prefill_ms: Number | None = None
    server_decode_ms: Number | None = None
    delivery_ms: Number | None = None


class ServerTiming(Record):
    """The server's per-request timings as sent (vLLM's --enable-per-request-metrics)."""

    time_to_first_token_ms: Number | None = None
    generation_time_ms: Number | None = None
    queue_time_ms: Number | None = None
    mean_itl_ms: Number | None = None
    tokens_per_second: Number | None = None


# -- the sections the run table reads (issue 36: cbbench/analysis/table.py by attribute) ------


class FromSend(Record):
    """summary.from_send (--max-concurrency): TTFT and E2EL from each request's send, the
    wait for a slot left out."""

    ttft_ms: Distribution | None = None
    e2el_ms: Distribution | None = None


class ClientBound(Record):
    """summary.client_bound (targets/client_health.py): the latency figures the client
    distorted, and why."""

    metrics: list[str] | None = None
    reasons: list[str] | None = None


class ShortOutputs(Record):
    """summary.short_outputs (analysis/summary/token_counts.py): completed requests that
    returned fewer output tokens than max_tokens asked for."""

    count: int | None = None
    share: Number | None = None
    mean_shortfall: Number | None = None
    checked: int | None = None


class PrefixCacheUse(Record):
    """summary.server_prefix_cache (analysis/server_side/server_cache.py): the server's own
    count of cached prompt tokens."""

    requests: int | None = None
    cached_tokens: Number | None = None
    prompt_tokens: Number | None = None
    hit_rate: Number | None = None


class Images(Record):
    """summary.images (analysis/summary/inputs.py): the chat requests that carried images."""

    requests: int | None = None
    images: int | None = None
    image_tokens: Number | None = None  # null where the server's usage did not tell them
    text_tokens: Number | None = None


class TurnSummary(Record):
    """One of summary.by_turn (analysis/summary/turns.py)."""

    turn: int
    completed: int | None = None
    failed: int | None = None
    mean_prompt_tokens: Number | None = None
    ttft_ms: Distribution | None = None
    tpot_ms: Distribution | None = None


class Sessions(Record):
    """summary.sessions (analysis/summary/turns.py): per-session figures (s)."""

    count: int | None = None
    completed: int | None = None
    turns_planned: int | None = None
    turns_sent: int | None = None
    duration_s: Distribution | None = None
    time_in_model_s: Distribution | None = None
    time_in_tools_s: Distribution | None = None
    time_in_subagents_s: Distribution | None = None


class ServerLatency(Record):
    """One of summary.http.server_latency (analysis/server_side/server_latency.py): the
    server's p50 from its histogram beside the client's."""

    server_p50: Number | None = None
    server_p50_bucket: list[Number | None] | None = None
    client_within_bucket: bool | None = None
    server_mean: Number | None = None
    client_p50: Number | None = None
    diff_p50: Number | None = None
    client_mean: Number | None = None
    diff_mean: Number | None = None  # absent from results written before it existed


class HttpInfo(Record):
    """summary.http: what an endpoint run learned of its client and server (the rest passes
    through). Not yet a field of Summary: analysis/server_side/audit.py reads summary.http as
    an extra field; the run table validates it into this model."""

    # The four figures' entries and a "note" (the histograms' caveat, a string).
    server_latency: dict[str, ServerLatency | str] | None = None


class Speculative(Record):
    """summary.speculative (analysis/summary/speculative.py, or scraped from the server)."""

    acceptance_rate: Number | None = None
    mean_acceptance_length: Number | None = None
    speculative_tokens: int | None = None
    source: str | None = None


class EngineSummary(Record):
    num_iterations: int | None = None
    busy_time_s: Number | None = None
    mean_iteration_ms: Number | None = None
    token_budget_utilization: Number | None = None
    peak_kv_usage: Number | None = None
    mean_kv_usage: Number | None = None
    num_preemptions: int | None = None
    mbu: Number | None = None
    mfu: Number | None = None
    mean_prefill_tokens: Number | None = None
    mean_decode_tokens: Number | None = None
    mean_running: Number | None = None
    mean_achieved_bw_gbps: Number | None = None
    prefix_cache_hit_rate: Number | None = None


class SteadyState(Record):
    """summary.steady_state: the figures of the run's steady window (ramp-up and drain out)."""

    window_s: list[Number | None] | None = None
    method: str | None = None
    note: str | None = None  # why there is no window
    completed: int | None = None
    failed: int | None = None
    cancelled: int | None = None
    duration_s: Number | None = None
    request_throughput: Number | None = None
    output_throughput: Number | None = None
    total_token_throughput: Number | None = None
    ttft_ms: Distribution | None = None
    tpot_ms: Distribution | None = None
    itl_ms: Distribution | None = None
    e2el_ms: Distribution | None = None
    level: Number | None = None  # the running count the window held (its method's)
    requests: int | None = None  # served in the window


class Worker(Record):
    """One of summary.workers (an endpoint run's load generators, distributed/merge.py)."""

    worker: int | str
    status: str
    completed: int | None = None
    failed: int | None = None
    host: str | None = None
    sent: int | None = None
    cancelled: int | None = None
    not_sent: int | None = None
    send_lag_p50_ms: Number | None = None
    send_lag_p99_ms: Number | None = None
    loop_lag_p99_ms: Number | None = None
    client_cpu_util: Number | None = None
    clock_uncertainty_ms: Number | None = None  # Ray workers: the clock offset's bound


WORKER_LOST = ("died", "failed")  # a worker's status when its requests are not all reported


class Summary(Record):
    completed: int | None = None  # every run writes both; a hand-made summary may not
    failed: int | None = None
    cancelled: int | None = None
    error_types: dict[str, int] | None = None
    duration_s: Number | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: Number | None = None
    output_throughput: Number | None = None
    total_token_throughput: Number | None = None
    ttft_ms: Distribution | None = None
    tpot_ms: Distribution | None = None
    itl_ms: Distribution | None = None
    e2el_ms: Distribution | None = None
    send_lag_ms: Distribution | None = None
    slo: dict[str, Number] | None = None
    goodput: Number | None = None
    slo_attainment: Number | None = None
    # "send": under --max-concurrency, TTFT and E2EL judged from the send (absent: from the
    # intended start).
    slo_basis: str | None = None
    not_sent: int | None = None
    steady_state: SteadyState | None = None
    engine: EngineSummary | None = None
    ttft_breakdown: Breakdown | None = None
    e2el_breakdown: Breakdown | None = None
    slices: list[TimeSlice] | None = None
    # Issue 26 (analysis/summary/inputs.py): embeddings/rerank, images, request payloads.
    input_throughput: Number | None = None
    inputs: int | None = None
    usage: dict[str, int] | None = None
    images: Images | None = None
    request_bytes: Distribution | None = None
    # HTTP runs with several models (--lora-modules) or endpoints (--endpoint A,B): the
    # figures of each (analysis/summary/splits.py), keyed by model name / endpoint URL.
    by_model: dict[str, dict[str, Any]] | None = None
    by_endpoint: dict[str, dict[str, Any]] | None = None
    workers: list[Worker] | None = None  # endpoint runs
    # The run table's other sections (analysis/table.py).
    event_gap_ms: Distribution | None = None
    tokens_per_event: Distribution | None = None
    ttfot_ms: Distribution | None = None
    reasoning_time_ms: Distribution | None = None
    reasoning_tokens: Distribution | None = None
    reasoning_share: Distribution | None = None
    slot_wait_ms: Distribution | None = None  # --max-concurrency
    from_send: FromSend | None = None
    client_bound: ClientBound | None = None
    short_outputs: ShortOutputs | None = None
    server_prefix_cache: PrefixCacheUse | None = None
    by_turn: list[TurnSummary] | None = None
    sessions: Sessions | None = None
    speculative: Speculative | None = None
    kv_transfer_ms: Distribution | None = None  # disaggregated prefill/decode


class Config(Record):
    label: str | None = None
    workload: str | None = None
    num_requests: int | None = None
    seed: int | None = None
    request_rate: str | Number | None = None
    burstiness: Number | None = None
    arrival: str | None = None
    time_scale: Number | None = None  # --time-scale on a trace (present only when set)
    target: str | None = None
    engine: str | None = None
    model: str | None = None
    scheduler: str | None = None
    policy: str | None = None
    command: str | None = None
    percentiles: list[Number] | None = None  # --percentiles: the pNN keys every distribution has
    slice_s: Number | None = None  # --slice
    # What the engine resolved to (engine/build_common.py EngineInfo and its config), as the
    # readers (report, calibrate, export, replay) read it. model_config stays an extra field:
    # pydantic reserves the name.
    device: str | None = None  # torch: cpu | cuda
    device_name: str | None = None
    gpu: str | None = None
    gpu_spec: dict[str, Any] | None = None
    dtype: str | None = None
    max_num_seqs: Any = None  # replay checks its kind itself (its own --max-num-seqs message)
    attention_backend: str | None = None
    # The options as given (true, false or "auto") or as resolved: calibrate reads their truth.
    fused_kernels: Any = None
    cuda_graphs: Any = None
    cuda_graphs_effective: Any = None
    # Shown as written (the report's runs table): no reader computes with them.
    engine_kind: Any = None
    chunked_prefill: Any = None
    kv_allocation: Any = None
    # The run table's header (analysis/table.py header_lines): shown as written; an
    # importer copies the endpoint's, api's and model's values from the file it reads.
    served_model: Any = None
    api: Any = None
    endpoint: Any = None
    endpoints: list[str] | None = None
    balance: str | None = None
    # Read by the exporters (export/br02.py), which check their kind themselves: a hand-edited
    # size of inf or NaN, or workers as a count or as {"count": N}, still exports.
    tensor_parallel_size: Any = None
    data_parallel_size: Any = None
    max_concurrency: Any = None
    workers: Any = None
    router: str | None = None
    disaggregate: str | None = None
    kv_link: str | None = None
    sessions: Any = None  # a multi-turn run's plan (load/session_plan.py)
    ramp: Any = None
    replay: str | None = None


class Request(Record):
    id: int | str
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    ttft_ms: Number | None = None
    tpot_ms: Number | None = None
    e2el_ms: Number | None = None
    error: str | None = None
    cancelled: bool | None = None
    error_type: str | None = None
    intended_start_s: Number | None = None
    send_lag_ms: Number | None = None
    num_preemptions: int | None = None
    priority: int | None = None
    queue_ms: Number | None = None
    max_tokens: int | None = None
    token_times_s: list[Number] | None = None
    itl_ms: list[Number] | None = None
    server_timing: ServerTiming | None = None
    ttft_parts: RequestParts | None = None
    e2el_parts: RequestParts | None = None
    # Issue 26: a chat request's images (null where unknown), embeddings/rerank inputs, and
    # the request body's bytes.
    images: int | None = None
    image_bytes: int | None = None
    image_tokens: int | None = None
    inputs: int | None = None
    request_bytes: int | None = None
    endpoint: str | None = None  # HTTP runs: the URL the request went to
    model: str | None = None  # HTTP runs: the model (or LoRA adapter) it asked for
    # What `cbbench audit` holds to the server's log (HTTP runs, --save-detailed): the send
    # and first answer token (run clock, s), each event's tokens, the server's response id.
    send_s: Number | None = None
    first_output_s: Number | None = None
    event_tokens: list[int] | None = None
    server_request_id: str | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None
    tool_calls: list[dict[str, Any]] | None = None
    turn: int | None = None  # a session workload's turn (from 1): BR0.2's multi_turn


Count = Annotated[int, Field(ge=0)]  # tokens, rows, requests, blocks: never negative


class Iteration(Record):
    index: int
    start_s: Number
    duration_s: Number
    num_prefill_tokens: Count
    num_decode_tokens: Count
    num_prefill_reqs: Count | None = None
    num_decode_reqs: Count | None = None
    # The batch shape the cost model read (what `cbbench calibrate` refits), and swap copies.
    num_logits: Count | None = None
    attn_key_pairs: Amount | None = None
    attn_keys_read: Amount | None = None
    attn_decode_keys: Amount | None = None
    num_swapped_out_blocks: Count | None = None
    num_swapped_in_blocks: Count | None = None
    draft_tokens: Count | None = None
    token_budget: int | None = None
    num_running: int | None = None
    num_waiting: int | None = None
    num_preempted: int | None = None
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    bytes_moved: Number | None = None
    flops: Number | None = None
    predicted_s: Number | None = None
    achieved_bw_gbps: Number | None = None  # bytes_moved over duration_s (the report's plot)


class TelemetrySample(Record):
    """One reading of one GPU (analysis/summary/telemetry.py TelemetrySample, a DCGM page's
    with its host): the fields the report's bandwidth plot reads; the rest pass through."""

    t_s: Number | None = None
    gpu: int | None = None
    dram_bw_util_pct: Number | None = None
    hostname: str | None = None  # DCGM exporters: the host the GPU is on
    total_energy_mj: Number | None = None  # the GPU's energy counter, mJ since driver load


class TelemetryStat(Record):
    """One sampled quantity over a window (analysis/summary/telemetry.py)."""

    mean: Number | None = None
    p50: Number | None = None
    p90: Number | None = None


class TelemetryQuantities(Record):
    """The sampled quantities over one window (the rest pass through)."""

    dram_bw_util_pct: TelemetryStat | None = None
    sm_util_pct: TelemetryStat | None = None
    power_w: TelemetryStat | None = None


class TelemetryGpu(Record):
    """One GPU's figures over the run (telemetry.per_gpu): a GPU is its host, UUID and index."""

    gpu: int | None = None
    hostname: str | None = None
    uuid: str | None = None
    energy_consumption_j: Number | None = None
    energy_method: str | None = None  # "counter" or "power_integration"
    run: TelemetryQuantities | None = None


class TelemetrySummary(Record):
    """telemetry.summary: the quantities over the whole run and over its steady window, each
    GPU's over the run, and the energy of all of them (J) and per output token."""

    run: TelemetryQuantities | None = None
    steady: TelemetryQuantities | None = None
    energy_consumption_j: Number | None = None
    energy_method: str | None = None  # one GPU's, or "mixed"
    energy_per_output_token_j: Number | None = None
    gpus: list[TelemetryGpu] | None = None


class Telemetry(Record):
    available: bool | None = None
    reason: str | None = None
    source: str | None = None
    metric: str | None = None  # the bandwidth counter sampled (dram_active_dcgm, ...)
    interval_s: Number | None = None
    samples: list[TelemetrySample] | None = None
    summary: TelemetrySummary | None = None


class RunResult(Record):
    schema_version: Literal[1]
    cbbench_version: str | None = None
    interrupted: bool | None = None
    started_at: str | None = None
    config: Config
    summary: Summary
    requests: list[Request] | None = None
    iterations: list[Iteration] | None = None
    telemetry: Telemetry | None = None
    # A sweep's or capacity search's point (bench/point_prep.py): what the server's prefix
    # cache reset answered, and the warm-up run before the point.
    prefix_cache_reset: list[dict[str, Any]] | None = None
    warmup_requests: dict[str, Any] | None = None

    def summary_only(self) -> RunResult:
        """--summary-only's file: no request or iteration records, no telemetry samples."""
        kept = self.model_dump(mode="json", exclude_unset=True, exclude={
            "requests": True, "iterations": True, "telemetry": {"samples"}})
        return RunResult.model_validate(kept)
