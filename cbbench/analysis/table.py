"""The summary table printed after a run (tabulate), read from the result's model
(cbbench/schema/run.py) by attribute. A caller holding the file's dict (a test, an older
caller) gets it validated into the model first (:func:`_as`)."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from cbbench.analysis.summary.slo import SLO_BASIS_SEND
from cbbench.schema.base import is_empty
from cbbench.schema.coerce import as_model
from cbbench.schema.run import (
    Config,
    Distribution,
    EngineSummary,
    HttpInfo,
    RunResult,
    ServerLatency,
    Speculative,
    Summary,
    Telemetry,
    TelemetryQuantities,
    TelemetryStat,
    TelemetrySummary,
    Worker,
)

LATENCY_KEYS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2EL", "e2el_ms"))
STATS = ("mean", "p50", "p90", "p99")
# Shown when any request reasoned (TTFT counts to the first token of any kind).
REASONING_ROWS = (
    ("TTFOT (ms)", "ttfot_ms"), ("reasoning time (ms)", "reasoning_time_ms"),
    ("reasoning tokens", "reasoning_tokens"), ("reasoning share", "reasoning_share"),
)


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _stat(d: Distribution | None, stat: str) -> Any:
    """A distribution's statistic (mean, or a pNN the run's --percentiles named: extra
    fields), None where the distribution or the statistic is missing."""
    return None if d is None else getattr(d, stat, None)


def _row(label: str, d: Distribution | None, stats: tuple[str, ...]) -> list[str]:
    return [label, *(_fmt(_stat(d, s)) for s in stats)]


CLIENT_BOUND_MARK = " *"


def latency_table(summary: Summary | dict, stats: tuple[str, ...] = STATS) -> str:
    """The latency distributions' rows; ``stats`` the columns (--percentiles, else STATS)."""
    s = as_model(Summary, summary)
    rows = []
    cb = s.client_bound
    bound = (cb.metrics or []) if cb else []
    for label, key in LATENCY_KEYS:
        mark = CLIENT_BOUND_MARK if key in bound else ""
        rows.append(_row(f"{label} (ms){mark}", getattr(s, key), stats))
    tpe = s.tokens_per_event
    if tpe is not None and (tpe.mean or 1) > 1:  # several tokens per event: the gap beside ITL
        rows.append(_row("event gap (ms)", s.event_gap_ms, stats))
        rows.append(_row("tokens / event", tpe, stats))
    # A request reasoned: the mean of its tokens (a p99 is not stored under every
    # --percentiles, and is 0 where under 1% of the requests reasoned).
    if (_stat(s.reasoning_tokens, "mean") or 0) > 0:
        for label, key in REASONING_ROWS:
            rows.append(_row(label, getattr(s, key), stats))
    from_send = None if is_empty(s.from_send) else s.from_send
    if from_send:  # --max-concurrency: both bases, labelled
        rows.append(_row("slot wait (ms)", s.slot_wait_ms, stats))
        rows.append(_row("TTFT from send (ms)", from_send.ttft_ms, stats))
        rows.append(_row("E2EL from send (ms)", from_send.e2el_ms, stats))
    table = tabulate(rows, headers=["", *stats], tablefmt="simple", disable_numparse=True)
    if from_send:
        table += (
            "\nTTFT and E2EL count from the intended start (the wait for a --max-concurrency "
            "slot included);\nthe 'from send' rows leave that wait out (as vLLM's benchmark)."
        )
    if bound and cb:
        table += "\n* client-bound: " + " ".join(cb.reasons or [])
    return table


def workers_table(workers: list[Worker] | list[dict] | None) -> str:
    """One row per load-generator worker, when there are several or one did not finish."""
    ws = [as_model(Worker, w) for w in workers or []]
    if not ws or (len(ws) == 1 and ws[0].status == "done"):
        return ""
    rows = []
    # --cancel-rate: sent = ok + failed + cancelled, so the column shows when any were.
    cancelled = any(w.cancelled for w in ws)
    for w in ws:
        cpu = w.client_cpu_util
        rows.append([
            w.worker, w.status, w.host or "-", w.sent, w.completed,
            w.failed, *([w.cancelled] if cancelled else []), w.not_sent,
            _fmt(w.send_lag_p50_ms),
            _fmt(w.send_lag_p99_ms), _fmt(w.loop_lag_p99_ms),
            "-" if cpu is None else f"{cpu:.0%}",
            "-" if w.clock_uncertainty_ms is None else _fmt(w.clock_uncertainty_ms, 3),
        ])
    headers = ["worker", "status", "host", "sent", "ok", "failed",
               *(["cancelled"] if cancelled else []), "not sent", "lag p50 ms",
               "lag p99 ms", "loop p99 ms", "CPU", "clock ± ms"]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def throughput_table(summary: Summary | dict) -> str:
    s = as_model(Summary, summary)
    rows = [
        ["completed / failed", f"{s.completed} / {s.failed}"]
        if not s.cancelled else
        ["completed / failed / cancelled", f"{s.completed} / {s.failed} / {s.cancelled}"],
        ["duration (s)", _fmt(s.duration_s, 3)],
        ["request throughput (req/s)", _fmt(s.request_throughput)],
        ["output throughput (tok/s)", _fmt(s.output_throughput, 1)],
        ["total token throughput (tok/s)", _fmt(s.total_token_throughput, 1)],
    ]
    rows += input_rows(s)
    short = s.short_outputs
    if short and short.checked:
        rows.append(
            ["short outputs (< max_tokens)", f"{short.count} / {short.checked} "
             f"(mean shortfall {short.mean_shortfall:.1f} tok)"]
        )
    cache = s.server_prefix_cache
    if cache and cache.hit_rate is not None:
        rows.append(["server prefix cache hit rate", f"{cache.hit_rate:.1%} "
                     f"({cache.cached_tokens:,} / {cache.prompt_tokens:,} tok)"])
    if s.goodput is not None:  # --slo
        rows.append(["goodput (req/s)", _fmt(s.goodput)])
        basis = " (TTFT, E2EL from send)" if s.slo_basis == SLO_BASIS_SEND else ""
        rows.append(["SLO attainment", f"{s.slo_attainment:.1%}{basis}"])
    return tabulate(rows, tablefmt="simple", disable_numparse=True)


def input_rows(summary: Summary | dict) -> list[list[str]]:
    """Embeddings/rerank input throughput, images and payload bytes (analysis/summary/inputs.py)."""
    s = as_model(Summary, summary)
    rows = []
    if s.input_throughput is not None:
        rows.append(["input throughput (tok/s)", _fmt(s.input_throughput, 1)])
        rows.append(["inputs sent", _fmt(s.inputs)])
    im = None if is_empty(s.images) else s.images
    if im:
        split = ("" if im.image_tokens is None else
                 f"; prompt tokens {im.image_tokens:,} image / {im.text_tokens:,} text")
        rows.append(["images", f"{im.images:,} in {im.requests:,} requests{split}"])
    payload = s.request_bytes
    if payload and payload.mean is not None:
        rows.append(["request payload (bytes, mean)", _fmt(payload.mean, 0)])
    return rows


def engine_table(engine: EngineSummary | dict | None) -> str:
    if engine is None or is_empty(engine):
        return ""
    eng = as_model(EngineSummary, engine)
    if not eng.num_iterations:
        return ""
    rows = [
        ["iterations", _fmt(eng.num_iterations)],
        ["mean iteration (ms)", _fmt(eng.mean_iteration_ms, 3)],
        ["mean prefill tokens / iter", _fmt(eng.mean_prefill_tokens, 1)],
        ["mean decode tokens / iter", _fmt(eng.mean_decode_tokens, 1)],
        ["token budget use", _pct(eng.token_budget_utilization)],
        ["mean running requests", _fmt(eng.mean_running, 1)],
        ["peak / mean KV use", f"{_pct(eng.peak_kv_usage)} / {_pct(eng.mean_kv_usage)}"],
        ["preemptions", _fmt(eng.num_preemptions)],
        ["analytic bandwidth (GB/s)", _fmt(eng.mean_achieved_bw_gbps, 1)],
    ]
    if eng.prefix_cache_hit_rate is not None:
        rows.append(["prefix cache hit rate", _pct(eng.prefix_cache_hit_rate)])
    if eng.mbu is not None:
        rows.append(["analytic MBU / MFU", f"{_pct(eng.mbu)} / {_pct(eng.mfu)}"])
    return tabulate(rows, tablefmt="simple", disable_numparse=True)


def speculative_line(speculative: Speculative | dict | None) -> str:
    """summary.speculative in one line (engine or scraped counters)."""
    if speculative is None or is_empty(speculative):
        return ""
    spec = as_model(Speculative, speculative)
    rate, length = spec.acceptance_rate, spec.mean_acceptance_length
    k = f", K={spec.speculative_tokens}" if spec.speculative_tokens else ""
    return (
        f"speculative decoding ({spec.source}{k}): acceptance rate "
        f"{'-' if rate is None else f'{rate:.1%}'}, mean acceptance length "
        f"{'-' if length is None else f'{length:.2f}'}"
    )


TURN_ROWS_SHOWN = 8  # the first turns; the result file holds them all


def by_turn_table(summary: Summary | dict, tail: str = "p99") -> str:
    """TTFT and TPOT by turn index, for multi-turn runs: their p50 and ``tail`` (tail_of)."""
    s = as_model(Summary, summary)
    turns = s.by_turn or []
    if not turns:
        return ""
    rows = [
        [t.turn, t.completed, _fmt(t.mean_prompt_tokens, 0),
         *(_fmt(_stat(t.ttft_ms, p)) for p in ("p50", tail)),
         *(_fmt(_stat(t.tpot_ms, p)) for p in ("p50", tail))]
        for t in turns[:TURN_ROWS_SHOWN]
    ]
    table = tabulate(
        rows, headers=["turn", "completed", "prompt", "TTFT p50", f"TTFT {tail}", "TPOT p50",
                       f"TPOT {tail}"],
        tablefmt="simple", disable_numparse=True,
    )
    if len(turns) > TURN_ROWS_SHOWN:
        table += f"\n(turns {TURN_ROWS_SHOWN + 1}-{turns[-1].turn}: see summary.by_turn)"
    ses = None if is_empty(s.sessions) else s.sessions
    if ses:
        table += (
            f"\nsessions: {ses.completed} of {ses.count} completed, "
            f"{ses.turns_sent} of {ses.turns_planned} turns sent"
        )
        split = [(label, _stat(d, "p50")) for label, d in (
            ("end to end", ses.duration_s), ("in the model", ses.time_in_model_s),
            ("in tools", ses.time_in_tools_s), ("in sub-agents", ses.time_in_subagents_s))]
        if any(v for label, v in split[2:]):  # an agent workload: where its time went
            table += "\nper session, p50 (s): " + ", ".join(
                f"{label} {v:.3f}" for label, v in split if v is not None)
    return table


def server_latency_table(http: HttpInfo | dict | None) -> str:
    """The server's own p50 (vLLM's histograms) beside the client's, with the difference, and
    the difference of the two means (exact on the server's side, unlike its p50)."""
    lat = as_model(HttpInfo, http).server_latency if http else None
    if not lat:
        return ""
    if isinstance(lat.get("missing"), str):  # the histograms' window was not the run's
        return f"server latency (vLLM histograms): missing: {lat['missing']}"
    rows = []
    why: list[str] = []
    for label, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"),
                       ("E2EL", "e2el_ms")):
        d = lat.get(key)
        if isinstance(d, ServerLatency):
            lo, hi = d.server_p50_bucket or (None, None)
            diff = _fmt(d.diff_p50)
            if d.client_within_bucket:  # below the histogram's resolution
                diff = f"within bucket {_fmt(lo, 0)}-{_fmt(hi, 0)}"
            missing = getattr(d, "missing", None)  # an extra field: why no server figure
            if isinstance(missing, str):
                why.append(f"{label}: missing: {missing}")
            rows.append([
                f"{label} p50 (ms)", _fmt(d.server_p50), _fmt(d.client_p50), diff,
                _fmt(d.diff_mean),  # absent from results written before it existed
            ])
    table = tabulate(
        rows,
        headers=["", "server", "client (from send)", "client - server", "diff of means"],
        tablefmt="simple", disable_numparse=True,
    )
    warning = lat.get("warning")
    return "\n".join([table, *why] + ([f"note: {warning}"] if isinstance(warning, str) else []))


# How the steady window was chosen, in words (summary.steady_state.method).
STEADY_HOW = {
    "running_requests": "the engine ran a steady ~{level:g} requests",
    "in_flight_requests": "a steady ~{level:g} requests were in flight",
    "warmup_cooldown": "--warmup and --cooldown left out",
}


def steady_state_line(summary: Summary | dict, tail: str = "p99") -> str:
    """The steady-state window and its headline figures, under the whole-run ones, in words:
    the span the run held its load, its ramp-up and drain left out. ``tail``: the tail
    percentile shown beside each p50 (tail_of)."""
    s = as_model(Summary, summary)
    ss = s.steady_state
    if ss is None or is_empty(ss):
        return ""
    if not ss.window_s:
        return f"steady state: none ({ss.method if ss.note is None else ss.note})"
    a, b = ss.window_s
    ttft, tpot = ss.ttft_ms, ss.tpot_ms
    method = ss.method or ""
    how = STEADY_HOW.get(method, method)
    if "{level" in how:
        how = how.format(level=round(ss.level, 1)) if ss.level is not None else \
            how.split(" ~")[0].replace("a steady", "steady") + " requests"
    if method != "warmup_cooldown":
        how += "; ramp-up and drain left out"
    if s.input_throughput is not None:  # embeddings / rerank: inputs, no output tokens
        rate = f"{_fmt((ss.total_token_throughput or 0) - (ss.output_throughput or 0), 1)} " \
            "input tok/s"
    else:
        rate = f"{_fmt(ss.output_throughput, 1)} output tok/s"
    line = (
        f"steady state, {a:.2f}-{b:.2f} s of the run ({how}): {ss.requests} requests, "
        f"TTFT p50 {_fmt(_stat(ttft, 'p50'))} / {tail} {_fmt(_stat(ttft, tail))} ms, "
        f"TPOT p50 {_fmt(_stat(tpot, 'p50'))} / {tail} {_fmt(_stat(tpot, tail))} ms, {rate}"
    )
    return line + (f"\n  note: {ss.note}" if ss.note else "")


def telemetry_line(telemetry: Telemetry | dict | None) -> str:
    """Measured HBM utilization, to read beside the analytic MBU above."""
    if telemetry is None or is_empty(telemetry):
        return ""
    tel = as_model(Telemetry, telemetry)
    if not tel.available:
        return f"GPU telemetry: unavailable ({tel.reason})"
    steady = (tel.summary.steady if tel.summary else None) or TelemetryQuantities()
    bw = steady.dram_bw_util_pct or TelemetryStat()
    sm = steady.sm_util_pct or TelemetryStat()
    fmt = lambda v: "-" if v is None else f"{v:.1f}%"  # noqa: E731
    line = (
        f"GPU telemetry ({tel.metric}, steady state): HBM util mean {fmt(bw.mean)}, "
        f"p90 {fmt(bw.p90)}; SM util mean {fmt(sm.mean)}"
    )
    summary = tel.summary or TelemetrySummary()
    if summary.energy_consumption_j is not None:
        line += f"\n  GPU energy over the run: {summary.energy_consumption_j:.1f} J " \
            f"({summary.energy_method})"
        if summary.energy_per_output_token_j is not None:
            line += f", {summary.energy_per_output_token_j:.4g} J per output token"
    gpus = summary.gpus or []
    for g in gpus if len(gpus) > 1 else []:  # one GPU's figures are the pooled ones
        run = g.run or TelemetryQuantities()
        hbm, util = (run.dram_bw_util_pct or TelemetryStat()), (run.sm_util_pct or TelemetryStat())
        power, energy = (run.power_w or TelemetryStat()).mean, g.energy_consumption_j
        name = f"{g.hostname} GPU {g.gpu}" if g.hostname else f"GPU {g.gpu}"
        line += (f"\n  {name} (run): HBM util mean {fmt(hbm.mean)}, SM util mean {fmt(util.mean)}"
                 f", power mean {'-' if power is None else f'{power:.0f} W'}, energy "
                 f"{'-' if energy is None else f'{energy:.1f} J'}")
    return line


def header_lines(config: Config | dict) -> list[str]:
    """What was run, before its figures: the target (engine, model, GPU, scheduler, or the
    endpoint and its model), the cluster (replicas, router, disaggregation) and the arrivals."""
    cfg = as_model(Config, config)
    label = f"{cfg.label} · " if cfg.label else ""
    title = f"cbbench · {label}{cfg.workload} · "
    if cfg.target == "engine":
        title += f"engine {cfg.engine} · {cfg.model}"
        if cfg.gpu:
            title += f" on {cfg.gpu}"
        sched = str(cfg.scheduler)
        if cfg.chunked_prefill and sched == "continuous":
            sched += " + chunked prefill"
        title += f" · {sched}"
    elif cfg.target == "http":
        model = cfg.served_model or cfg.model or "(the server's default)"
        title += f"endpoint {_endpoints(cfg)} · model {model}"
        if cfg.api:
            title += f" · --api {cfg.api}"
    else:
        title += str(cfg.target)
    lines = [title]
    cluster = cluster_line(cfg)
    if cluster:
        lines.append(cluster)
    arrivals = arrivals_line(cfg)
    if arrivals:
        lines.append(arrivals)
    return lines


def _endpoints(cfg: Config) -> str:
    eps = cfg.endpoints
    if eps and len(eps) > 1:
        return f"{', '.join(eps)} (--balance {cfg.balance})"
    return str(cfg.endpoint or "(not recorded)")


def cluster_line(config: Config | dict) -> str:
    """Data-parallel replicas and their router, disaggregated prefill/decode: blank for one
    engine."""
    cfg = as_model(Config, config)
    bits = []
    dp = cfg.data_parallel_size or 1
    if dp > 1:
        bits.append(f"{dp} data-parallel replicas, router {cfg.router}")
    if (cfg.tensor_parallel_size or 1) > 1:
        bits.append(f"tensor parallel {cfg.tensor_parallel_size}")
    if cfg.disaggregate:
        bits.append(f"disaggregated prefill:decode {cfg.disaggregate} instances, KV "
                    f"over {cfg.kv_link}")
    return f"cluster: {'; '.join(bits)}" if bits else ""


def arrivals_line(config: Config | dict) -> str:
    """How the requests arrive; with --request-rate inf, what that means for TTFT."""
    cfg = as_model(Config, config)
    noun = "sessions" if cfg.sessions else "requests"  # a multi-turn run counts sessions
    n = f"{cfg.num_requests} {noun}" if cfg.num_requests else noun
    rate = cfg.request_rate
    if cfg.replay:
        return f"arrivals: replayed from {cfg.replay}"
    if cfg.arrival == "trace":  # its own arrival_s, not --request-rate (inf by default)
        scale = cfg.time_scale
        times = "its arrival_s" if scale in (None, 1.0) else f"its arrival_s x {scale:g}"
        return f"arrivals: {n} at the trace's own times ({times})"
    if rate == "inf" and not cfg.ramp and not cfg.sessions:
        return (f"arrivals: all {n} at t=0 (--request-rate inf): TTFT includes each "
                "request's wait behind the others; --request-rate N spreads them")
    if isinstance(rate, (int, float)):
        process = ("Poisson" if cfg.arrival == "gamma" and cfg.burstiness == 1.0
                   else str(cfg.arrival))
        per = "sessions/s" if cfg.sessions else "req/s"
        return f"arrivals: {n} at {rate:g} {per} ({process})"
    return ""


def kv_transfer_line(config: Config | dict, summary: Summary | dict) -> str:
    """A disaggregated run's prefill-to-decode KV transfer per request: its mean, p50 and the
    run's tail percentile (tail_of)."""
    from cbbench.analysis.table_views import tail_of

    kv = as_model(Summary, summary).kv_transfer_ms
    if not kv or not kv.count:
        return ""
    cfg = as_model(Config, config)
    tail = tail_of(cfg)
    return (f"KV transfer prefill -> decode over {cfg.kv_link} (ms per "
            f"request): mean {_fmt(kv.mean)}, p50 {_fmt(_stat(kv, 'p50'))}, {tail} "
            f"{_fmt(_stat(kv, tail))} ({kv.count} requests)")


def _http_of(s: Summary) -> dict | None:
    """summary.http stays an extra field of the summary model for now (its client-health
    keys are read elsewhere as the dict they are); the table validates its server_latency."""
    return (s.model_extra or {}).get("http")


def render_summary(result: RunResult | dict) -> str:
    # A dict (a test's hand-made result): validated into the model first.
    run = result if isinstance(result, RunResult) else \
        RunResult.model_validate({"schema_version": 1, **result})
    s, cfg = run.summary, run.config
    parts_title = header_lines(cfg)
    from cbbench.analysis.table_views import breakdown_table, slices_table, stats_of, tail_of

    stats, tail = stats_of(cfg, STATS), tail_of(cfg)
    parts = [*parts_title, "", throughput_table(s), "", latency_table(s, stats)]
    for extra in (breakdown_table(s, stats), slices_table(s, tail)):
        if extra:
            parts += ["", extra]
    for section in (steady_state_line(s, tail), by_turn_table(s, tail),
                    server_latency_table(_http_of(s)),
                    workers_table(s.workers), engine_table(s.engine),
                    kv_transfer_line(cfg, s), speculative_line(s.speculative),
                    telemetry_line(run.telemetry)):
        if section:
            parts += ["", section]
    if run.interrupted:
        parts += ["", "INTERRUPTED: the figures cover only what finished."]
    return "\n".join(parts)
